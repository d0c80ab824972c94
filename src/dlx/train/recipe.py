"""Recipes: a YAML file of sections, `--section.key VALUE` overrides on top, and the resolved copy in the run folder."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import yaml

from dlx.atomic import atomic_write_text
from dlx.errors import UserError
from dlx.train.config import SECTIONS, RunConfig, build_config
from dlx.train.rundir.folder import RUN_CONFIG_FILE
from dlx.yamlfile import load_unique_keys


def read_recipe_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"cannot read recipe {path}: {e.strerror}; give a YAML recipe (see recipes/)") from None
    try:
        data = load_unique_keys(text)
    except yaml.YAMLError as e:
        first_line = str(e).splitlines()[0] if str(e) else "parse error"
        raise UserError(f"recipe {path} is not valid YAML: {first_line}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"recipe {path} must be a mapping of sections ({', '.join(SECTIONS)})")
    return data


def scan_arguments(args: list[str]) -> tuple[list[str], list[tuple[str, str | None, list[str]]]]:
    """The positional arguments, and each `--name VALUE` or `--name=VALUE` as (name, value or None, its arguments).

    The one place that decides whether a flag takes the next argument as its value: it does unless there is none or
    it starts with `--`.
    """
    positional, flags, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            positional.append(arg)
            i += 1
            continue
        name, has_value, value = arg[2:].partition("=")
        takes_next = not has_value and i + 1 < len(args) and not args[i + 1].startswith("--")
        flags.append((name, value if has_value else args[i + 1] if takes_next else None, args[i : i + 1 + takes_next]))
        i += 1 + takes_next
    return positional, flags


def parse_overrides(args: list[str]) -> list[tuple[str, str, str]]:
    """`--train.lr 1e-3` or `--train.lr=1e-3` -> [("train", "lr", "1e-3")]."""
    positional, flags = scan_arguments(args)
    if positional:
        raise UserError(
            f"unexpected argument {positional[0]!r}; overrides look like --section.key VALUE, e.g. --train.lr 1e-3"
        )
    parsed = []
    for name, value, raw in flags:
        if "." not in name:
            raise UserError(
                f"unexpected argument {raw[0]!r}; overrides look like --section.key VALUE, e.g. --train.lr 1e-3"
            )
        name = name.replace("\n", "\\n")  # echoed in the messages below, which must stay one line
        if value is None:
            raise UserError(f"override --{name} needs a value, e.g. --{name} VALUE")
        section, _, key = name.partition(".")
        if section not in SECTIONS:
            raise UserError(f"override --{name}: unknown section '{section}'; the sections are {', '.join(SECTIONS)}")
        if not key or "." in key:
            raise UserError(f"override --{name} must name one key of a section, e.g. --{section}.KEY VALUE")
        parsed.append((section, key, value))
    return parsed


def coerce_value(section: str, key: str, raw: str) -> Any:
    """A command-line string as the recipe's YAML would have given it; strings stay strings for string-typed keys
    (so a dataset folder named `2024` is not read as a number); `none` is a choice of some keys
    (parallel.strategy), not null."""
    if raw in _choices(section, key):
        return raw
    if raw.strip().lower() in ("null", "none", "~"):
        return None
    if _is_string_field(section, key):
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _annotation(section: str, key: str) -> Any:
    field = RunConfig.model_fields[section].annotation.model_fields.get(key)  # type: ignore[union-attr]
    return None if field is None else field.annotation


def _choices(section: str, key: str) -> tuple[Any, ...]:
    annotation = None if section == "model" else _annotation(section, key)
    return typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else ()


def _is_string_field(section: str, key: str) -> bool:
    if section == "model":
        return key in ("preset", "init_from")
    annotation = _annotation(section, key)
    return annotation is str or (typing.get_origin(annotation) is typing.Literal)


def apply_overrides(raw: dict[str, Any], overrides: list[tuple[str, str, str]]) -> dict[str, Any]:
    merged = {name: dict(value) if isinstance(value, dict) else value for name, value in raw.items()}
    for section, key, value in overrides:
        if not isinstance(merged.setdefault(section, {}), dict):
            raise UserError(f"recipe: section '{section}' must be a mapping, not {merged[section]!r}")
        merged[section][key] = coerce_value(section, key, value)
    return merged


def load_recipe(
    path: str | Path | None, overrides: list[str], base: dict[str, Any] | None = None, resuming: bool = False
) -> RunConfig:
    """The recipe file (or `base`, or the defaults), with command-line overrides, validated once; model.init_from's
    folder read here, once (`dlx.train.init.init_from.resolve_init`). `resuming`: the run continues from its checkpoint,
    so init_from's weights may be gone (the run folder's config.yaml then gives the shape)."""
    raw = read_recipe_file(path) if path is not None else dict(base or {})
    raw = apply_overrides(raw, parse_overrides(overrides))
    init = None
    if isinstance(raw.get("model"), dict) and raw["model"].get("init_from"):
        from dlx.train.init.init_from import resolve_init  # torch: only for a recipe that needs it

        init = resolve_init(raw, resuming)
    return build_config(raw, init)


def config_yaml(config: RunConfig) -> str:
    return yaml.safe_dump(config.resolved(), sort_keys=False, default_flow_style=None)


def write_resolved(config: RunConfig, run_dir: Path) -> Path:
    path = run_dir / RUN_CONFIG_FILE
    atomic_write_text(path, config_yaml(config))
    return path


def split_command_line(args: list[str]) -> tuple[str | None, list[str]]:
    """`[RECIPE.yaml] [--section.key VALUE ...]` in any order -> (recipe or None, the override arguments)."""
    positional, flags = scan_arguments(args)
    if len(positional) > 1:
        raise UserError(
            f"two recipes given ({positional[0]!r} and {positional[1]!r}); give one, and overrides as "
            "--section.key VALUE"
        )
    return (positional[0] if positional else None), [arg for _, _, raw in flags for arg in raw]
