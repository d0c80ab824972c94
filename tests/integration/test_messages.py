"""Messages that lead somewhere: every recipe key a message names exists, and each message below says what is so."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

from dlx.cli.app import _register_commands, app, main, spell_bool_flags
from dlx.model.args import ModelArgs
from dlx.train.config import SECTIONS
from train_helpers import make_dataset, run_cli

ROOT = Path(__file__).parents[2]
FILE_SUFFIXES = {"safetensors", "json", "jsonl", "yaml", "yml", "py", "md", "png", "pt", "bin", "txt", "csv", "log"}
"""`model.safetensors`, `eval.jsonl`: file names, not keys."""


def key_pattern() -> re.Pattern[str]:
    """`section.key` as a whole word: not inside a dotted name (`dlx.train.config`, `model.layers.{}.mlp`) or a path.
    `section.prefix_*` names the keys that start with the prefix."""
    return re.compile(rf"(?<![\w./])({'|'.join(SECTIONS)})\.([A-Za-z_]\w*\*?)(?![\w(/-]|\.[\w{{])")


def dlx(args: list[str], capsys, monkeypatch) -> tuple[int, str, str]:
    """`dlx ARGS` in this process, through the console command's own `main`: (exit status, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["dlx", *args])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def recipe_keys(capsys, monkeypatch) -> set[str]:
    """What `dlx pretrain --keys` lists, read from the config classes now (other sections and keys may be added)."""
    code, out, _ = dlx(["pretrain", "--keys"], capsys, monkeypatch)
    assert code == 0
    keys, section = set(), None
    for line in out.splitlines():
        if line and not line.startswith(" "):
            section = line.rstrip(":")
        elif line.strip() and not line.strip().startswith("<"):
            keys.add(f"{section}.{line.strip().split(':')[0]}")
    return keys | {f"model.{name}" for name in ModelArgs.model_fields}  # `<any ModelArgs field>` in the listing


def python_strings(path: Path) -> Iterator[tuple[int, str]]:
    """Every string literal of a module; an f-string with `{}` where its expressions go."""
    tree = ast.parse(path.read_text())
    inside_f_strings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
            inside_f_strings.update(id(v) for v in node.values)
            yield node.lineno, "".join(str(p) for p in parts)
    for node in ast.walk(tree):
        is_string = isinstance(node, ast.Constant) and isinstance(node.value, str)
        # `"model.layers."` is a name prefix in code, not prose
        if is_string and id(node) not in inside_f_strings and not re.fullmatch(r"[\w.]+\.", node.value):
            yield node.lineno, node.value


def named_keys() -> dict[str, list[str]]:
    """Every `section.key` in dlx's messages and docs (src/ string literals, README.md, recipes/) -> where."""
    found: dict[str, list[str]] = {}
    texts = [(p, line, text) for p in sorted((ROOT / "src").rglob("*.py")) for line, text in python_strings(p)]
    for path in [ROOT / "README.md", *sorted((ROOT / "recipes").glob("*.yaml"))]:
        texts += [(path, n, text) for n, text in enumerate(path.read_text().splitlines(), start=1)]
    for path, line, text in texts:
        for match in key_pattern().finditer(text):
            if match.group(2) not in FILE_SUFFIXES:
                found.setdefault(match.group(0), []).append(f"{path.relative_to(ROOT)}:{line}")
    return found


def names_a_key(named: str, keys: set[str]) -> bool:
    """`eval.every` is a key; `eval.sample_*` names at least one (eval.sample_every, ...)."""
    if named.endswith("*"):
        return any(key.startswith(named[:-1]) for key in keys)
    return named in keys


def test_every_key_a_message_names_exists(capsys, monkeypatch) -> None:
    found, keys = named_keys(), recipe_keys(capsys, monkeypatch)
    missing = {key: where for key, where in found.items() if not names_a_key(key, keys)}
    assert not missing, f"messages name keys that `dlx pretrain --keys` does not list: {missing}"
    # The scan sees the keys it should (advice, errors, README overrides), so an empty result cannot pass unseen:
    assert {"data.num_workers", "data.prefetch", "eval.every", "train.lr", "data.micro_batch_size"} <= set(found)
    assert len(found) >= 25
    assert "eval.sample_*" in found and not names_a_key("eval.no_such_*", keys)


def test_the_scan_finds_a_wrong_key_and_ignores_file_and_dotted_names() -> None:
    text = "raise data.workers; see model.safetensors, eval.jsonl, dlx.train.config, model.layers.{}.mlp, --train.lr"
    names = [m.group(0) for m in key_pattern().finditer(text) if m.group(2) not in FILE_SUFFIXES]
    assert names == ["data.workers", "train.lr"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["plan", "demo", "--json", "true"], ["plan", "demo", "--json"]),
        (["plan", "demo", "--json=false"], ["plan", "demo"]),
        (["data", "info", "--json", "DIR"], ["data", "info", "--json", "DIR"]),
        (["data", "info", "DIR", "--json", "0"], ["data", "info", "DIR"]),
        (
            ["pretrain", "--resume", "yes", "--train.compile", "true"],
            ["pretrain", "--resume", "--train.compile", "true"],
        ),
        (["export-hf", "A", "B", "--overwrite", "false"], ["export-hf", "A", "B", "--no-overwrite"]),
        (
            ["pretrain", "--resume=auto", "--run-dir=R", "--train.max_steps=10"],
            ["pretrain", "--resume", "auto", "--run-dir=R", "--train.max_steps=10"],
        ),
        (["pretrain", "--resume", "auto", "--run-dir", "R"], ["pretrain", "--resume", "auto", "--run-dir", "R"]),
        (["pretrain", "--resume=false", "--train.device=auto"], ["pretrain", "--train.device=auto"]),
    ],
)
def test_boolean_flags_take_true_and_false(args, expected) -> None:
    _register_commands()
    assert spell_bool_flags(typer.main.get_command(app), args) == expected


def one_line_error(result: tuple[int, str, str]) -> str:
    code, out, err = result
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_boolean_flags_end_to_end(tmp_path) -> None:
    """Through the installed console command, in a child process, once."""
    data = make_dataset(tmp_path / "data")
    assert run_cli(["data", "info", str(data), "--json", "true"], tmp_path).stdout.startswith("{")
    result = run_cli(["data", "info", str(data), "--json=maybe"], tmp_path)
    error = one_line_error((result.returncode, result.stdout, result.stderr))
    assert error == "error: --json takes true or false (or no value), not 'maybe'"


def test_a_wrong_word_for_resume_names_auto(capsys, monkeypatch) -> None:
    error = one_line_error(dlx(["pretrain", "--resume=maybe"], capsys, monkeypatch))
    assert error == "error: --resume takes true, auto or false (or no value), not 'maybe'"


def test_plan_lists_the_known_gpus_for_an_unknown_one(capsys, monkeypatch) -> None:
    error = one_line_error(dlx(["plan", "demo", "--gpu", "H100X"], capsys, monkeypatch))
    assert error.startswith("error: --gpu 'H100X' is not in dlx's peak table; the known GPUs: H100 SXM, H100 PCIe")
    for name in ("L40S", "4090", "3090", "A10", "A6000", "H20", "MI300X"):
        assert f" {name}," in error or error.endswith(f" {name}")
    assert "L40S bf16 dense" in dlx(["plan", "demo", "--gpu", "L40S"], capsys, monkeypatch)[1]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (
            lambda d: None,
            "error: --resume: {d} does not exist, so there is no run to resume; start one without --resume",
        ),
        (lambda d: d.mkdir(), "error: --resume: {d} holds no run (config.yaml is missing: no run was started there)"),
        (lambda d: d.write_text("x"), "error: --resume: {d} is a file, not a run folder; pass the run's folder"),
    ],
)
def test_resume_says_what_the_folder_is(tmp_path, make, expected, capsys, monkeypatch) -> None:
    run_dir = tmp_path / "run"
    make(run_dir)
    error = one_line_error(dlx(["pretrain", "--resume", "--run-dir", str(run_dir)], capsys, monkeypatch))
    assert error.startswith(expected.format(d=run_dir))


def test_resume_before_the_first_checkpoint_says_so(tmp_path) -> None:
    from dlx.train.rundir.folder import no_checkpoint_note

    (tmp_path / "checkpoints").mkdir()
    assert "has no checkpoint yet (the run stopped before its first save)" in no_checkpoint_note(tmp_path)
    (tmp_path / "checkpoints" / "step-00000004.damaged").mkdir()
    assert "no complete checkpoint (damaged, set aside: step-00000004.damaged)" in no_checkpoint_note(tmp_path)


def test_run_dir_that_is_a_file(tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "run").write_text("x")
    args = ["pretrain", "--model.preset", "debug", "--data.seq_len", "16", "--train.max_steps", "1", "--run-dir"]
    args.append(str(tmp_path / "run"))
    error = one_line_error(dlx(args, capsys, monkeypatch))
    assert error == f"error: --run-dir {tmp_path / 'run'} is a file, not a folder; pick another --run-dir"


def test_prepare_accepts_the_out_datasets_own_tokenizer(tmp_path) -> None:
    """A dataset prepared with --train-tokenizer, rerun with --tokenizer pointing at its own tokenizer.json."""
    from dlx.data.prepare import prepare_dataset

    corpus = tmp_path / "a.txt"
    corpus.write_text("".join(f"line {i} of a small corpus with words to merge\n" for i in range(300)))
    options = {"workers": 1, "progress": False}
    first = prepare_dataset([str(corpus)], tmp_path / "ds", train_tokenizer=300, **options)
    for given in (tmp_path / "ds", tmp_path / "ds" / "tokenizer.json"):
        assert prepare_dataset([str(corpus)], tmp_path / "ds", tokenizer=given, **options) == first


def test_prepare_interrupted_says_what_it_kept(tmp_path) -> None:
    from dlx.cli.data_commands import interrupted_note

    assert "before the first shard was written" in interrupted_note(tmp_path / "none", "SIGINT")
    data = make_dataset(tmp_path / "data")
    note = interrupted_note(data, "SIGINT")
    assert note.startswith(f"stopped by SIGINT: {data} keeps 2 finished shard(s) (62,389 tokens)")
    assert "run the same command again to continue" in note
