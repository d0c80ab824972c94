"""The Llama-3 module: exact parameter counts, Meta's FFN rule, meta-device construction, validation."""

import pytest
import torch

from dlx.errors import UserError
from dlx.model import ModelArgs, Transformer, resolve_model_args
from dlx.model.presets import PRESETS
from dlx.model.stats import ParamFormula, build_meta_model, count_parameters, model_stats

EXPECTED_TOTALS = {
    "seed-135m": 135_529_984,
    "seed-165m": 164_897_280,
    "llama3.2-1b": 1_235_814_400,
    "llama3.2-3b": 3_212_749_824,
    "llama3-8b": 8_030_261_248,
}


@pytest.mark.parametrize(("preset", "total"), EXPECTED_TOTALS.items())
def test_preset_parameter_counts_are_exact(preset, total):
    stats = model_stats(resolve_model_args(preset))
    assert stats.total == total
    assert stats.trainable == total
    assert stats.untrainable == 0


@pytest.mark.parametrize(
    ("preset", "hidden"), [("seed-135m", 2048), ("llama3.2-1b", 8192), ("llama3.2-3b", 8192), ("llama3-8b", 14336)]
)
def test_ffn_hidden_dim_follows_meta_rule(preset, hidden):
    assert resolve_model_args(preset).ffn_hidden_dim == hidden


def test_meta_count_equals_materialised_count():
    args = resolve_model_args("debug", tie_embeddings=True)
    real = Transformer(args)
    assert count_parameters(real).total == sum(p.numel() for p in real.parameters())
    assert count_parameters(real).total == model_stats(args).total


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("tie", [False, True])
def test_the_formula_is_the_modules_count(preset, tie):
    """The one formula (planner, preflight, FLOPs) against the real module on the meta device, part by part."""
    args = resolve_model_args(preset, tie_embeddings=tie)
    formula, stats = ParamFormula(args), model_stats(args)
    assert formula.total == stats.total
    assert formula.embedding == stats.embedding
    assert formula.norms + args.n_layers * (formula.attention + formula.ffn) == stats.per_module["layers"] + args.dim
    module = build_meta_model(args)
    matmuls = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    assert formula.matmul == sum(m.weight.numel() for m in matmuls)


def test_tied_embeddings_share_one_tensor():
    model = Transformer(resolve_model_args("debug", tie_embeddings=True))
    assert model.output.weight is model.tok_embeddings.weight


def test_eight_billion_model_on_meta_costs_no_memory():
    with torch.device("meta"):
        model = Transformer(resolve_model_args("llama3-8b"))
    assert all(p.device.type == "meta" for p in model.parameters())


def test_forward_shapes_and_causality():
    torch.manual_seed(0)
    model = Transformer(resolve_model_args("debug"))
    tokens = torch.randint(0, 512, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, 512)
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 512
    # Changing later tokens must not change earlier logits.
    torch.testing.assert_close(model(changed)[:, :10], logits[:, :10])


def test_seed_args_dict_constructs_model_args():
    seed = {
        "dim": 512,
        "n_layers": 8,
        "n_heads": 1,
        "n_kv_heads": 1,
        "vocab_size": 128256,
        "multiple_of": 1024,
        "ffn_dim_multiplier": 1.3,
        "norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "max_seq_len": 150,
    }
    assert ModelArgs(**seed) == resolve_model_args("seed-165m")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_heads": 3}, "n_heads (3) must divide dim (64)"),
        ({"n_kv_heads": 3}, "n_kv_heads (3) must divide n_heads (4)"),
        ({"dim": -1}, "field 'dim'"),
        ({"depth": 3}, "unknown field 'depth'"),
    ],
)
def test_bad_fields_name_the_problem(overrides, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_model_args("debug", **overrides)


def test_model_file_overrides(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("dim: 128\nn_layers: 1\nn_heads: 4\nvocab_size: 100\n")
    args = resolve_model_args(str(path), n_layers=2)
    assert (args.dim, args.n_layers, args.kv_heads) == (128, 2, 4)
