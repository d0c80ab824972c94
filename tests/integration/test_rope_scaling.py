"""RoPE scaling kinds llama3, linear and yarn: inverse frequencies and cos/sin tables bit-identical to transformers'
(fp32, torch.equal), HF Llama folders with each kind load with equal logits and export back to the dict transformers
reads, config.json's rope_scaling read as transformers reads it, init_from may switch kind (the header says so), and a
bad rope_scaling is one line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from dlx.errors import UserError
from dlx.model import Transformer, resolve_model_args
from dlx.model.hf import args_from_hf_config, hf_rope_scaling, load_hf, save_hf
from dlx.model.rope import attention_factor, inverse_frequencies, rope_tables
from dlx.train.launch import launch
from dlx.train.recipe import load_recipe
from hf_helpers import BASE, write_hf_llama
from train_helpers import TINY, make_dataset

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

pytestmark = pytest.mark.usefixtures("in_process_training")

SCALINGS = {  # dlx's field names; HF's original_max_position_embeddings is original_max_seq_len
    "linear-4": {"rope_type": "linear", "factor": 4.0},
    "linear-2.5": {"rope_type": "linear", "factor": 2.5},
    "yarn-defaults": {"rope_type": "yarn", "factor": 4.0, "original_max_seq_len": 32},
    "yarn-betas-untruncated": {
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_seq_len": 8192,
        "beta_fast": 64.0,
        "beta_slow": 2.0,
        "truncate": False,
    },
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_seq_len": 4096,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
    },
    "yarn-attention-factor": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_seq_len": 2048,
        "attention_factor": 1.5,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_seq_len": 16,
    },
}
SHAPES = {"theta-5e5-head-128": (512, 4, 500000.0), "theta-1e4-head-16": (64, 4, 10000.0)}


def hf_config_for(args, rope_scaling: dict | None):
    return transformers.LlamaConfig(
        hidden_size=args.dim,
        num_attention_heads=args.n_heads,
        num_hidden_layers=1,
        vocab_size=args.vocab_size,
        max_position_embeddings=args.max_seq_len,
        rope_theta=args.rope_theta,
        rope_scaling=rope_scaling,
    )


def hf_tables(config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """transformers' inv_freq, cos, sin (max_position_embeddings, head_dim) and attention scaling for `config`."""
    rotary = LlamaRotaryEmbedding(config)
    head_dim = config.hidden_size // config.num_attention_heads
    positions = torch.arange(config.max_position_embeddings)[None]
    cos, sin = rotary(torch.zeros(1, config.max_position_embeddings, head_dim), positions)
    return rotary.inv_freq, cos[0], sin[0], rotary.attention_scaling


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", SCALINGS)
def test_frequencies_and_tables_are_transformers_bit_for_bit(kind, shape):
    dim, n_heads, theta = SHAPES[shape]
    fields = {"dim": dim, "n_heads": n_heads, "n_layers": 1, "vocab_size": 8, "max_seq_len": 300, "rope_theta": theta}
    args = resolve_model_args(None, **fields, rope_scaling=SCALINGS[kind])
    inv_freq, cos, sin, scale = hf_tables(hf_config_for(args, hf_rope_scaling(args.rope_scaling)))
    assert torch.equal(inverse_frequencies(args), inv_freq)
    assert attention_factor(args.rope_scaling) == scale
    dlx_cos, dlx_sin = rope_tables(args)
    assert torch.equal(dlx_cos, cos) and torch.equal(dlx_sin, sin)
    plain = resolve_model_args(None, **fields)
    assert not torch.equal(inverse_frequencies(plain), inv_freq)  # the scaling does something to compare


def test_every_yarn_setting_changes_the_tables():
    """So that the parity cases above exercise beta_fast, beta_slow, truncate, mscale and attention_factor."""
    base = {"rope_type": "yarn", "factor": 16.0, "original_max_seq_len": 8192}
    variants = [{}, {"beta_fast": 64.0}, {"beta_slow": 2.0}, {"truncate": False}, {"factor": 8.0}]
    variants += [{"mscale": 0.707, "mscale_all_dim": 1.0}, {"attention_factor": 1.5}]
    tables = []
    for variant in variants:
        args = resolve_model_args(None, dim=512, n_heads=4, rope_scaling={**base, **variant})
        tables.append((inverse_frequencies(args).tolist(), attention_factor(args.rope_scaling)))
    assert len({json.dumps(t) for t in tables}) == len(variants)
    assert tables[0][1] == 0.1 * __import__("math").log(16.0) + 1.0  # YaRN's Eq. 21 without mscale


@pytest.mark.parametrize("kind", SCALINGS)
def test_a_transformers_llama_with_the_scaling_loads_with_equal_logits(kind, tmp_path):
    hf_scaling = hf_rope_scaling(resolve_model_args("debug", rope_scaling=SCALINGS[kind]).rope_scaling)
    hf = write_hf_llama(tmp_path / "hf", 300, rope_scaling=dict(hf_scaling), tie=True).eval()
    model = load_hf(tmp_path / "hf").eval()
    assert model.args.rope_scaling == resolve_model_args("debug", rope_scaling=SCALINGS[kind]).rope_scaling
    tokens = torch.randint(0, 300, (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", SCALINGS)
def test_the_export_writes_the_dict_transformers_reads_back(kind, tmp_path):
    torch.manual_seed(0)
    model = Transformer(resolve_model_args("debug", rope_scaling=SCALINGS[kind])).eval()
    out = save_hf(model, tmp_path / "hf")
    written_config = json.loads((out / "config.json").read_text())
    written = written_config["rope_scaling"]
    scaling = SCALINGS[kind]  # YaRN's configured context is original × factor, which transformers checks; else 128
    context = round(scaling["original_max_seq_len"] * scaling["factor"]) if kind.startswith("yarn") else 128
    assert written_config["max_position_embeddings"] == context
    assert written_config.get("dlx_trained_max_seq_len") == (128 if context != 128 else None)
    expected = {
        "original_max_position_embeddings" if k == "original_max_seq_len" else k: v for k, v in SCALINGS[kind].items()
    }
    if kind.startswith("yarn"):  # the defaults are written out, so older readers need not know them
        expected = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True, **expected}
    assert written == expected
    config = transformers.AutoConfig.from_pretrained(out)
    assert config.rope_parameters == {**expected, "rope_theta": 10000.0}
    hf = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = torch.randint(0, 512, (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), atol=1e-5, rtol=0)


HF_SPELLINGS = {  # config.json spellings transformers accepts, and what each means to it
    "legacy-type-key": {"type": "linear", "factor": 3.0},
    "yarn-original-from-max-position": {"rope_type": "yarn", "factor": 2.0},
    "yarn-factor-null": {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 32},
    "yarn-betas-null": {"rope_type": "yarn", "factor": 4.0, "beta_fast": None, "beta_slow": None},
    "yarn-with-rope-theta-inside": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0},
}


@pytest.mark.parametrize("spelling", HF_SPELLINGS)
def test_config_json_rope_scaling_is_read_as_transformers_reads_it(spelling):
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "vocab_size": 8,
        "max_position_embeddings": 128,
        "rope_theta": 10000.0,
        "rope_scaling": HF_SPELLINGS[spelling],
    }
    args = args_from_hf_config(json.loads(json.dumps(config)))
    hf_config = transformers.LlamaConfig(**json.loads(json.dumps(config)))
    inv_freq, cos, _, scale = hf_tables(hf_config)
    assert torch.equal(inverse_frequencies(args), inv_freq) and attention_factor(args.rope_scaling) == scale
    assert torch.equal(rope_tables(args)[0], cos)


def test_a_bad_rope_scaling_in_config_json_is_one_line_naming_the_file(tmp_path):
    write_hf_llama(tmp_path, 300, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_scaling"], config["rope_parameters"] = {"rope_type": "yarn", "factor": 0.5}, None
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"config\.json: field 'rope_scaling\.factor': .* greater than or equal to 1"):
        load_hf(tmp_path)


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_a_kind_dlx_does_not_compute_is_one_line_on_import(rope_type, tmp_path):
    write_hf_llama(tmp_path, 300)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": rope_type, "factor": 2.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        UserError, match=f"rope_scaling type '{rope_type}' is not supported; dlx computes llama3, linear, yarn"
    ):
        load_hf(tmp_path)


YARN_64 = "rope_type: yarn, factor: 4, original_max_seq_len: 64"
BAD_RECIPES = {  # --model.rope_scaling VALUE -> the message
    "{rope_type: dynamic, factor: 2}": r"rope_type must be one of llama3, linear, yarn \(HF's dynamic NTK .* yarn or",
    "{rope_type: yarn, factor: 4}": (
        r"rope_scaling\.original_max_seq_len is required for rope_type 'yarn'; "
        r"rope_scaling with rope_type 'yarn' takes rope_type, factor, original_max_seq_len, beta_fast"
    ),
    "{rope_type: linear}": r"rope_scaling\.factor is required for rope_type 'linear'; .* takes rope_type, factor$",
    "{rope_type: linear, factor: 2, low_freq_factor: 1}": r"low_freq_factor is not a field of rope_type 'linear'",
    "{rope_type: yarn, factor: 0.5, original_max_seq_len: 64}": (
        r"field 'rope_scaling\.factor': Input should be greater than or equal to 1 \(got 0\.5\)"
    ),
    "{rope_type: linear, factor: 0.9}": r"field 'rope_scaling\.factor': Input should be greater than or equal to 1",
    f"{{{YARN_64}, beta_fast: 1}}": r"beta_fast \(1\.0\) must be greater than beta_slow \(1\.0\)",
    f"{{{YARN_64}, attention_factor: 0}}": r"field 'rope_scaling\.attention_factor': Input should be greater than 0",
    "{low_freq_factor: 4, high_freq_factor: 4}": r"high_freq_factor \(4\.0\) must be greater than low_freq_factor",
}


@pytest.mark.parametrize("value", BAD_RECIPES)
def test_a_bad_rope_scaling_is_one_line_naming_the_fix(value):
    with pytest.raises(UserError, match=BAD_RECIPES[value]) as error:
        load_recipe(None, [*TINY, "--train.max_steps", "1", "--model.rope_scaling", value])
    assert "\n" not in str(error.value)


def test_hf_names_paste_into_a_recipe():
    """config.json's rope_scaling as it is: original_max_position_embeddings is original_max_seq_len."""
    value = "{rope_type: yarn, factor: 4, original_max_position_embeddings: 64}"
    args = load_recipe(None, [*TINY, "--train.max_steps", "1", "--model.rope_scaling", value]).model.args
    assert args.rope_scaling.original_max_seq_len == 64
    assert resolve_model_args("debug", rope_scaling={"factor": 8.0}).rope_scaling.rope_type == "llama3"  # as before


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("rope")
    dataset = make_dataset(root / "data")
    write_hf_llama(root / "hf", 300, tokenizer=dataset / "tokenizer.json")
    return root / "hf", dataset


@pytest.mark.parametrize(
    "value", ["{rope_type: linear, factor: 2}", "{rope_type: yarn, factor: 4, original_max_seq_len: 32}"]
)
def test_init_from_may_change_the_kind(value, hf_dir):
    hf, dataset = hf_dir
    args = load_recipe(
        None, [*BASE, "--model.init_from", str(hf), "--data.path", str(dataset), "--model.rope_scaling", value]
    ).model.args
    assert args.rope_scaling is not None and args.rope_scaling.rope_type == value.split(",")[0].split()[-1]
    assert (args.dim, args.rope_theta) == (64, 10000.0)


def test_a_run_that_switches_to_yarn_says_so_and_trains_with_it(hf_dir, tmp_path, capsys):
    hf, dataset = hf_dir
    yarn = "{rope_type: yarn, factor: 4, original_max_seq_len: 32}"
    more = ["--model.rope_scaling", yarn, "--train.max_steps", "1", "--data.num_workers", "0"]
    run_dir = tmp_path / "run"
    assert (
        launch(None, [*BASE, "--model.init_from", str(hf), "--data.path", str(dataset), *more], run_dir, resume=False)
        == 0
    )
    header = capsys.readouterr().out
    expected = (
        "rope_scaling none → yarn(factor=4.0, original_max_seq_len=32, beta_fast=32.0, beta_slow=1.0, truncate=True)"
    )
    assert f"changed at init_from: {expected}" in header
    saved = (run_dir / "config.yaml").read_text()
    assert "rope_type: yarn" in saved and "original_max_seq_len: 32" in saved


class RecordedWarnings(logging.Handler):
    """transformers' own log records (its logger does not propagate to pytest's caplog)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


EXPORT_AFTER_CHANGE = {  # --model.* overrides at init_from -> (max_position_embeddings, how the export says it follows)
    "yarn": (
        ["--model.rope_scaling", "{rope_type: yarn, factor: 8, original_max_seq_len: 32}"],
        256,
        "yarn's original_max_seq_len 32 × factor 8, not model.init_from's 128, as RoPE changed at init_from "
        "(rope_scaling none → yarn(factor=8.0, original_max_seq_len=32, beta_fast=32.0, beta_slow=1.0, "
        "truncate=True)); trained with max_seq_len 32, kept in config.json as dlx_trained_max_seq_len",
    ),
    "linear": (
        ["--model.rope_scaling", "{rope_type: linear, factor: 2}"],
        32,
        "the trained max_seq_len, not model.init_from's 128, as RoPE changed at init_from (rope_scaling none → "
        "linear(factor=2.0))",
    ),
    "rope_theta": (
        ["--model.rope_theta", "20000"],
        32,
        "the trained max_seq_len, not model.init_from's 128, as RoPE changed at init_from (rope_theta 10000.0 → "
        "20000.0)",
    ),
}


@pytest.mark.parametrize("change", EXPORT_AFTER_CHANGE)
def test_export_after_a_rope_change_states_the_context_the_new_rope_was_made_for(change, hf_dir, tmp_path, capsys):
    """The source's max_position_embeddings (128) describes RoPE the model no longer has; the unchanged case keeps
    it (tests/integration/test_trust2.py, test_export_of_an_init_from_run_keeps_the_source_context)."""
    from dlx.cli.model_commands import export_hf

    hf, dataset = hf_dir
    overrides, expected, how = EXPORT_AFTER_CHANGE[change]
    more = [*overrides, "--model.max_seq_len", "32", "--train.max_steps", "1", "--data.num_workers", "0"]
    run_dir = tmp_path / "run"
    assert launch(None, [*BASE, "--model.init_from", str(hf), "--data.path", str(dataset), *more], run_dir, False) == 0
    capsys.readouterr()
    export_hf(run_dir, tmp_path / "export", dtype="keep", overwrite=False)
    assert f"max_position_embeddings {expected}: {how}\n" in capsys.readouterr().out
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["max_position_embeddings"] == expected
    assert config.get("dlx_trained_max_seq_len") == (32 if expected != 32 else None)
    tokenizer_config = json.loads((tmp_path / "export" / "tokenizer_config.json").read_text())
    assert tokenizer_config["model_max_length"] == expected
    recorded = RecordedWarnings()
    logging.getLogger("transformers").addHandler(recorded)
    try:
        transformers.LlamaForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32)
        assert [m for m in recorded.messages if "max_position_embeddings" in m or "rope" in m.lower()] == []
        if change == "yarn":  # the source's 128 over original 32 is 4, not the factor 8: transformers says so
            transformers.LlamaConfig(**{**config, "max_position_embeddings": 128})
            assert any("implicit factor = " in m and "= 4.0)" in m for m in recorded.messages)
    finally:
        logging.getLogger("transformers").removeHandler(recorded)
