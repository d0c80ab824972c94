"""Generation with a KV cache gives the same tokens as recomputing the whole prefix."""

import torch

from dlx.model import Transformer, resolve_model_args
from dlx.model.generate import sample_next


def _model(**overrides):
    torch.manual_seed(0)
    return Transformer(resolve_model_args("debug", **overrides)).eval()


def test_cached_and_uncached_greedy_decoding_agree():
    model = _model()
    prompt = torch.randint(0, 512, (3, 7))
    cached = model.generate(prompt, 20, use_cache=True)
    uncached = model.generate(prompt, 20, use_cache=False)
    assert cached.shape == (3, 27)
    assert torch.equal(cached, uncached)


def test_cached_and_uncached_sampling_agree_with_same_generator():
    model = _model(n_kv_heads=1)
    prompt = torch.randint(0, 512, (2, 5))
    kwargs = {"temperature": 0.8, "top_k": 50, "top_p": 0.9}
    a = model.generate(prompt, 15, use_cache=True, generator=torch.Generator().manual_seed(3), **kwargs)
    b = model.generate(prompt, 15, use_cache=False, generator=torch.Generator().manual_seed(3), **kwargs)
    assert torch.equal(a, b)


def test_generation_stops_at_max_seq_len_and_eos():
    model = _model(max_seq_len=12)
    out = model.generate(torch.zeros(1, 10, dtype=torch.long), 50)
    assert out.shape == (1, 12)
    first = model.generate(torch.zeros(1, 3, dtype=torch.long), 1)[0, -1].item()
    stopped = model.generate(torch.zeros(1, 3, dtype=torch.long), 5, eos_id=first)
    assert stopped.shape == (1, 4)


def test_top_k_and_top_p_restrict_the_candidates():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 10.0]])
    gen = torch.Generator().manual_seed(0)
    draws = {sample_next(logits, 1.0, top_k=2, generator=gen).item() for _ in range(200)}
    assert draws <= {3, 4}
    # The top token holds > 99.9 % of the mass: top_p=0.5 keeps it alone.
    assert {sample_next(logits, 1.0, top_p=0.5, generator=gen).item() for _ in range(50)} == {4}
    assert sample_next(logits, 0.0).item() == 4
