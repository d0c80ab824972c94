"""Hugging Face Llama format both ways: logits equal within 1e-4 in fp32, tied and untied, with GQA."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dlx.errors import UserError
from dlx.model import Transformer, resolve_model_args
from dlx.model.hf import load_hf, save_hf

transformers = pytest.importorskip("transformers")

SHAPES = {
    "untied-gqa": {"tie_embeddings": False, "n_kv_heads": 2},
    "tied-gqa": {"tie_embeddings": True, "n_kv_heads": 1},
    "tied-gqa-llama3-rope": {
        "tie_embeddings": True,
        "n_kv_heads": 2,
        "max_seq_len": 64,
        "rope_theta": 500000.0,
        "rope_scaling": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_seq_len": 16},
    },
}


def _tokens(vocab=512):
    return torch.randint(0, vocab, (2, 48), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("shape", SHAPES)
def test_dlx_to_hf_logits_match(tmp_path, shape):
    torch.manual_seed(0)
    model = Transformer(resolve_model_args("debug", **SHAPES[shape])).eval()
    save_hf(model, tmp_path / "hf")
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32).eval()
    tokens = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), atol=1e-4, rtol=0)
    assert hf.config.tie_word_embeddings == model.args.tie_embeddings


@pytest.mark.parametrize("shape", SHAPES)
def test_hf_to_dlx_logits_match(tmp_path, shape):
    args = resolve_model_args("debug", **SHAPES[shape])
    config = transformers.LlamaConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.dim,
        intermediate_size=200,  # not expressible by Meta's rule with multiple_of 16: exercises the import mapping
        num_hidden_layers=args.n_layers,
        num_attention_heads=args.n_heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_seq_len,
        rms_norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        tie_word_embeddings=args.tie_embeddings,
        rope_scaling=None
        if args.rope_scaling is None
        else {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    model = load_hf(tmp_path / "hf").eval()
    assert model.args.ffn_hidden_dim == 200
    tokens = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=1e-4, rtol=0)


def test_sharded_checkpoint_with_index_loads(tmp_path):
    torch.manual_seed(0)
    model = Transformer(resolve_model_args("debug")).eval()
    save_hf(model, tmp_path / "one")
    tensors = load_file(tmp_path / "one" / "model.safetensors")
    names = sorted(tensors)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        file = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, sharded / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (sharded / "config.json").write_text((tmp_path / "one" / "config.json").read_text())
    tokens = _tokens()
    with torch.no_grad():
        assert torch.equal(load_hf(sharded)(tokens), model(tokens))


def test_other_architecture_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UserError, match="not a Llama model"):
        load_hf(tmp_path)
