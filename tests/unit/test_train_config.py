"""The recipe: sections, defaults, overrides and the one-line errors for bad input."""

from __future__ import annotations

import pytest

from dlx.errors import UserError
from dlx.model.presets import resolve_model_args
from dlx.train.config import SECTIONS, RunConfig, build_config, describe_keys
from dlx.train.recipe import config_yaml, load_recipe, read_recipe_file, split_command_line


def test_defaults_validate_and_resolved_config_round_trips(tmp_path):
    config = load_recipe(None, ["--train.max_steps", "5"])
    again = build_config(config.resolved())
    assert again.resolved() == config.resolved()
    assert again.model.args == config.model.args
    (tmp_path / "c.yaml").write_text(config_yaml(config))
    assert load_recipe(tmp_path / "c.yaml", []).resolved() == config.resolved()


def test_every_field_has_a_one_line_docstring():
    for section in SECTIONS:
        fields = RunConfig.model_fields[section].annotation.model_fields
        for key, info in fields.items():
            assert info.description and "\n" not in info.description, f"{section}.{key}"
    assert any(line.startswith("  lr: 0.0003") for line in describe_keys())


def test_overrides_are_typed_like_yaml():
    config = load_recipe(
        None,
        [
            "--train.max_steps=7",
            "--train.betas",
            "[0.8, 0.99]",
            "--log.tensorboard",
            "false",
            "--data.path",
            "synthetic",
            "--model.preset",
            "debug",
            "--model.n_layers",
            "3",
            "--train.lr",
            "1e-3",
            "--data.seq_len",
            "32",
        ],
    )
    assert config.train.max_steps == 7 and config.train.betas == (0.8, 0.99) and config.train.lr == 1e-3
    assert config.model.args.n_layers == 3 and config.model.args.dim == 64


def test_a_string_key_keeps_a_numeric_looking_value():
    with pytest.raises(UserError, match="dataset folder 2024 does not exist"):
        from dlx.train.build.data import inspect_dataset

        inspect_dataset(load_recipe(None, ["--data.path", "2024", "--train.max_steps", "1"]))


def test_recipe_then_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {preset: debug}\ndata: {seq_len: 32}\ntrain: {max_steps: 3, lr: 0.01}\n")
    assert load_recipe(recipe, ["--train.lr", "0.02"]).train.lr == 0.02
    assert split_command_line(["--train.lr", "1", "r.yaml", "--log.every=2"]) == (
        "r.yaml",
        ["--train.lr", "1", "--log.every=2"],
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--train.foo", "1"], "unknown key 'train.foo'; train keys are max_steps"),
        (["--trian.lr", "1"], "unknown section 'trian'"),
        (["--model.dimm", "3"], "unknown key 'model.dimm'"),
        (["--train.lr", "-1"], "train.lr: input should be greater than 0"),
        (["--train.lr", "abc"], "train.lr: input should be a valid number"),
        (["--train.lr", "inf"], "train.lr"),
        (["--data.micro_batch_size", "0"], "data.micro_batch_size: input should be greater than 0"),
        (["--data.seq_len", "-5"], "data.seq_len"),
        (["--train.grad_accum", "2.5"], "train.grad_accum: input should be a valid integer"),
        (["--train.precision", "fp8"], "train.precision: input should be 'auto', 'bf16', 'fp16' or 'fp32'"),
        (["--train.nan_policy", "ignore"], "train.nan_policy"),
        (["--train.min_lr", "1"], "train.min_lr (1.0) must be at most train.lr"),
        (["--train.betas", "[0.9, 1.5]"], "train.betas"),
        (["--log.tensorboard", "maybe"], "log.tensorboard"),
        (["--model.preset", "nope"], "unknown model preset 'nope'"),
        (["--model.preset", "debug", "--data.seq_len", "4096"], "data.seq_len (4096) exceeds model.max_seq_len"),
        (["--data.path", "synthetic", "--train.max_steps", "null"], "synthetic data has no epochs"),
        (["--train.max_steps"], "needs a value"),
        (["stray"], "unexpected argument 'stray'"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(args, message):
    base = [] if "max_steps" in " ".join(args) else ["--train.max_steps", "3"]
    with pytest.raises(UserError) as error:
        load_recipe(None, [*base, *args])
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [("train: [1, 2\n", "not valid YAML"), ("- a\n- b\n", "must be a mapping"), ("train: 5\n", "train: input should")],
)
def test_bad_recipe_files(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        load_recipe(path, [])
    with pytest.raises(UserError, match="cannot read recipe"):
        read_recipe_file(tmp_path / "missing.yaml")


def test_every_strategy_has_one_row_of_traits():
    """parallel.strategy's choices, the strategy classes and the traits table name the same strategies."""
    import typing

    from dlx.parallel.build import STRATEGIES
    from dlx.parallel.config import ParallelConfig
    from dlx.parallel.strategy import DeepSpeedStrategy
    from dlx.parallel.traits import STRATEGY_TRAITS, resumed_by

    all_choices = typing.get_args(ParallelConfig.model_fields["strategy"].annotation)
    choices = [choice for choice in all_choices if choice != "auto"]  # auto becomes one of the others
    assert list(STRATEGY_TRAITS) == choices
    assert {name: cls.name for name, cls in STRATEGIES.items()} | {"deepspeed": DeepSpeedStrategy.name} == {
        name: name for name in choices
    }
    assert resumed_by("full") == ("none", "ddp") and resumed_by("dcp") == ("none", "ddp", "fsdp", "hsdp")
    assert resumed_by("deepspeed") == ("deepspeed",) and resumed_by("other") == ()
    assert [STRATEGY_TRAITS[name].checkpoint_format_for(2) for name in ("none", "ddp", "fsdp")] == ["dcp"] * 3


def test_validation_reads_no_weights_the_recipe_loader_does(tmp_path):
    """A config is pure data: model.init_from is resolved by load_recipe, once, and handed to validation."""
    missing = str(tmp_path / "gone")
    raw = {"model": {"preset": "debug", "init_from": missing}, "data": {"seq_len": 16}, "train": {"max_steps": 1}}
    config = build_config(raw)
    assert config.model.init is None and config.model.args == resolve_model_args("debug")
    with pytest.raises(UserError, match=r"^recipe: model\.init_from \S+gone does not exist or is not a folder"):
        load_recipe(None, [], base=raw)
