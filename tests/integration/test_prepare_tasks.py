"""`dlx prepare --tasks N --task-index I` and `--merge`: the merged dataset is byte for byte the one-machine one for
any N; tasks and merges resume after a kill; bad combinations are one line, exit 2, and change nothing."""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from dlx.data.prepare import merge, merge_tasks, prepare_dataset, prepare_task, tasks
from dlx.data.prepare.inputs import InputList
from dlx.data.prepare.options import task_slot
from dlx.data.prepare.taskdir import read_plan
from dlx.data.prepare.units import choose_unit_bytes, plan_units
from dlx.errors import UserError
from prepare_helpers import assert_one_line_error, dlx, folder_bytes, make_documents, tiny_tokenizer, write_jsonl

__all__ = ["tiny_tokenizer"]


def tree_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under folder (the task folders too), by relative path."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def multi_frame_zst(path: Path, data: bytes, frame_bytes: int) -> Path:
    """A .zst of one frame per `frame_bytes` of data (frames cut mid-line, as pzstd cuts them)."""
    compressor = zstandard.ZstdCompressor(level=1)
    path.write_bytes(b"".join(compressor.compress(data[i : i + frame_bytes]) for i in range(0, len(data), frame_bytes)))
    return path


def jsonl_bytes(docs: list[str]) -> bytes:
    return "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs).encode()


def make_corpus(root: Path) -> list[str]:
    """Inputs of every kind whose units come in uneven sizes: byte ranges of a .jsonl, frames of a .jsonl.zst, row
    groups of a Parquet file, small files grouped, a JSON array, a gzip file, and one bad record."""
    docs = make_documents(2400, seed=31)
    write_jsonl(root / "a.jsonl", docs[:700])
    multi_frame_zst(root / "b.jsonl.zst", jsonl_bytes(docs[700:1500]), 3000)
    table = pa.table({"text": docs[1500:2100], "id": list(range(600))})
    pq.write_table(table, root / "c.parquet", row_group_size=40, compression="none")
    (root / "d.json").write_text(json.dumps([{"text": d} for d in docs[2100:2200]]))
    (root / "e.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(docs[2200:2300])))
    (root / "small").mkdir()
    for i, d in enumerate(docs[2300:2400]):
        (root / "small" / f"{i:03d}.txt").write_text(d)
    (root / "f.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    return [str(root / n) for n in ("a.jsonl", "b.jsonl.zst", "c.parquet", "d.json", "e.jsonl.gz", "small", "f.jsonl")]


def run_tasks(inputs: list[str], out: Path, n: int, order: list[int] | None = None, **options) -> None:
    for i in order or list(range(n)):
        prepare_task(inputs, out, tasks=n, task_index=i, workers=1, progress=False, **options)


@pytest.mark.parametrize(
    ("options", "task_counts"),
    [
        (dict(shard_tokens=20_000, val_fraction=0.1), (1, 2, 3)),
        (dict(shard_tokens=15_000, val_documents=40, add_bos=True), (2,)),
    ],
)
def test_merge_is_byte_identical_to_one_machine_for_any_task_count(tmp_path, tiny_tokenizer, options, task_counts):
    inputs = make_corpus(tmp_path)
    options = dict(options, tokenizer=tiny_tokenizer)
    one = prepare_dataset(inputs, tmp_path / "one", workers=1, progress=False, **options)
    units = list(plan_units(InputList(tuple(inputs)).measure(), choose_unit_bytes(one.source["request"]["bytes"])))
    pieces = {Path(u.files[0].path).name for u in units if u.end is not None}
    assert {"a.jsonl", "b.jsonl.zst", "c.parquet"} <= pieces, "the large files are cut into several units"
    assert len(one.split_shards("train")) >= 5 and one.source["scan"]["bad_records"] == 1
    for n in task_counts:
        out = tmp_path / f"tasks{n}"
        run_tasks(inputs, out, n, order=list(reversed(range(n))), **options)
        sizes = [end - first for first, end, *_ in read_plan(out)["ranges"]]
        assert sum(sizes) == len(units) and (n == 1 or len(set(sizes)) > 1), f"uneven shares of units: {sizes}"
        merged = merge_tasks(out, workers=2 if n == 2 else 1, progress=False)
        assert merged == one
        assert tree_bytes(out) == tree_bytes(tmp_path / "one"), f"{n} tasks"


def test_killed_task_and_killed_merge_resume_to_the_same_bytes(tmp_path, tiny_tokenizer, monkeypatch):
    inputs = make_corpus(tmp_path)
    options = dict(tokenizer=tiny_tokenizer, shard_tokens=12_000)
    prepare_dataset(inputs, tmp_path / "one", workers=1, progress=False, **options)
    monkeypatch.setattr(tasks, "COMMIT_SECONDS", 0.0)
    monkeypatch.setattr(merge, "COMMIT_SECONDS", 0.0)
    out = tmp_path / "out"
    real_write_state, calls = tasks.write_state, {"state": 0, "commit": 0}

    def crashing_write_state(*a, **k):
        calls["state"] += 1
        if calls["state"] == 3:  # the third unit's parts are in the folder, its commit never happens
            raise KeyboardInterrupt
        return real_write_state(*a, **k)

    monkeypatch.setattr(tasks, "write_state", crashing_write_state)
    with pytest.raises(KeyboardInterrupt):
        run_tasks(inputs, out, 2, order=[1], **options)
    state = json.loads((out / ".tasks" / "task-00001" / "state.json").read_text())
    first = read_plan(out)["ranges"][1][0]
    assert state["next_unit"] == first + 2 and not state["done"]
    assert (out / ".tasks" / "task-00001" / f"{first + 2:08d}.tok").exists(), "an uncommitted part was left"
    monkeypatch.setattr(tasks, "write_state", real_write_state)
    run_tasks(inputs, out, 2, order=[1, 0], **options)

    real_commit = merge.commit_shards

    def crashing_commit(*a, **k):
        calls["commit"] += 1
        if calls["commit"] == 3:
            raise KeyboardInterrupt
        return real_commit(*a, **k)

    monkeypatch.setattr(merge, "commit_shards", crashing_commit)
    with pytest.raises(KeyboardInterrupt):
        merge_tasks(out, workers=1, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert not manifest["complete"] and len(manifest["shards"]) == 2 and (out / ".tasks").is_dir()
    monkeypatch.setattr(merge, "commit_shards", real_commit)
    merge_tasks(out, workers=1, progress=False)
    assert tree_bytes(out) == tree_bytes(tmp_path / "one")


def _kill_when(cmd: list[str], ready) -> list[psutil.Process]:
    """Start cmd, SIGKILL it once ready() is true; the processes it had (None if it finished first)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if ready():
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            return tree[1:]
        time.sleep(0.005)
    assert proc.wait(30) == 0, proc.stderr.read().decode() if proc.stderr else ""
    return []


def test_sigkilled_task_and_merge_leave_no_worker_and_finish_on_rerun(tmp_path, tiny_tokenizer):
    docs = make_documents(4000, seed=32)
    write_jsonl(tmp_path / "a.jsonl", docs)
    base = [sys.executable, "-m", "dlx", "prepare", "--out", str(tmp_path / "out"), "--no-progress", "--workers", "2"]
    options = ["--tokenizer", str(tiny_tokenizer), "--shard-tokens", "2000"]
    task = [*base, str(tmp_path / "a.jsonl"), *options, "--tasks", "2", "--task-index", "0"]
    folder = tmp_path / "out" / ".tasks" / "task-00000"
    workers = _kill_when(task, lambda: folder.is_dir() and any(p.suffix == ".doc" for p in folder.iterdir()))
    assert workers, "the task was killed while its workers ran"
    assert not psutil.wait_procs(workers, timeout=10)[1], "workers outlived their killed task"
    state = folder / "state.json"
    assert not state.exists() or not json.loads(state.read_text())["done"], "the task was killed before its end"
    for index in ("0", "1"):
        assert subprocess.run([*task[:-1], index], capture_output=True, timeout=120).returncode == 0
    workers = _kill_when([*base, "--merge"], lambda: any((tmp_path / "out").glob("train-*.bin")))
    assert workers, "the merge was killed while its workers ran"
    assert not psutil.wait_procs(workers, timeout=10)[1], "workers outlived their killed merge"
    assert not json.loads((tmp_path / "out" / "manifest.json").read_text())["complete"]
    assert subprocess.run([*base, "--merge"], capture_output=True, timeout=120).returncode == 0
    prepare_dataset(
        [str(tmp_path / "a.jsonl")], tmp_path / "one", tokenizer=tiny_tokenizer, shard_tokens=2000, progress=False
    )
    assert folder_bytes(tmp_path / "out") == folder_bytes(tmp_path / "one")
    assert not (tmp_path / "out" / ".tasks").exists()


def test_bad_task_runs_and_merges_are_one_line_and_change_nothing(tmp_path, tiny_tokenizer):
    write_jsonl(tmp_path / "a.jsonl", make_documents(300, seed=33))
    write_jsonl(tmp_path / "b.jsonl", make_documents(300, seed=34))
    a, out = str(tmp_path / "a.jsonl"), tmp_path / "out"
    task = ["prepare", a, "--out", str(out), "--tokenizer", str(tiny_tokenizer), "--workers", "1", "--no-progress"]
    assert dlx(*task, "--tasks", "3", "--task-index", "0").returncode == 0
    before = tree_bytes(out)
    assert_one_line_error(dlx(*task, "--tasks", "3", "--task-index", "1", "--shard-tokens", "5"), "shard_tokens")
    assert_one_line_error(dlx(*task, "--tasks", "2", "--task-index", "1"), "--tasks 3 there, 2 here")
    other = ["prepare", str(tmp_path / "b.jsonl"), *task[2:]]
    assert_one_line_error(dlx(*other, "--tasks", "3", "--task-index", "1"), "differs in: inputs")
    assert_one_line_error(dlx(*task, "--tasks", "3", "--task-index", "3"), "out of range", "0 … 2")
    assert_one_line_error(dlx(*task, "--tasks", "3", "--train-tokenizer", "300"), "--train-tokenizer")
    untokenized = [arg for arg in task if arg not in ("--tokenizer", str(tiny_tokenizer))]
    assert_one_line_error(dlx(*untokenized, "--tasks", "3", "--task-index", "1"), "--tasks needs --tokenizer")
    assert_one_line_error(dlx("prepare", "--out", str(out), "--merge"), "2 of 3 tasks are not done", "1 (not started)")
    assert_one_line_error(dlx("prepare", a, "--out", str(out), "--merge"), "drop INPUTS")
    assert_one_line_error(dlx(*task), "split into tasks")  # a one-machine run into a folder of tasks
    assert tree_bytes(out) == before

    elsewhere = tmp_path / "elsewhere"
    alien = ["prepare", a, "--out", str(elsewhere), *task[4:], "--shard-tokens", "999", "--tasks", "3"]
    assert dlx(*alien, "--task-index", "1").returncode == 0
    shutil.copytree(elsewhere / ".tasks" / "task-00001", out / ".tasks" / "task-00001")
    before = tree_bytes(out)
    assert_one_line_error(dlx(*task, "--tasks", "3", "--task-index", "1"), "task-00001 belongs to another dataset")
    assert_one_line_error(dlx("prepare", "--out", str(out), "--merge"), "task-00001 belongs to another dataset")
    assert tree_bytes(out) == before
    shutil.rmtree(out / ".tasks" / "task-00001")
    for index in ("1", "2"):
        assert dlx(*task, "--tasks", "3", "--task-index", index).returncode == 0
    before = tree_bytes(out)
    fd = os.open(out, os.O_RDONLY)  # what a running merge holds
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert_one_line_error(dlx("prepare", "--out", str(out), "--merge"), "another `dlx prepare` is writing")
    finally:
        os.close(fd)
    assert tree_bytes(out) == before
    assert dlx("prepare", "--out", str(out), "--merge", "--workers", "1").returncode == 0
    result = dlx(*task, "--tasks", "3", "--task-index", "1")
    assert result.returncode == 0 and "already prepared" in result.stderr


def test_merge_refuses_a_corpus_without_documents_before_writing(tmp_path, tiny_tokenizer):
    (tmp_path / "bad.jsonl").write_text('{"other": 1}\n')
    out = tmp_path / "out"
    run_tasks([str(tmp_path / "bad.jsonl")], out, 1, tokenizer=tiny_tokenizer)
    before = tree_bytes(out)
    with pytest.raises(UserError, match="no documents found in 1 input file"):
        merge_tasks(out, workers=1, progress=False)
    assert tree_bytes(out) == before


@pytest.mark.parametrize(
    ("tasks", "index", "environ", "expected"),
    [
        (None, None, {"SLURM_ARRAY_TASK_ID": "1", "RANK": "0"}, None),  # a plain prepare never splits itself
        ("4", 2, {"RANK": "1", "WORLD_SIZE": "8"}, (4, 2)),  # options beat the environment
        (
            "auto",
            None,
            {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "8"},
            (8, 4),
        ),
        (
            "auto",
            None,
            {
                "SLURM_ARRAY_TASK_ID": "6",
                "SLURM_ARRAY_TASK_MIN": "0",
                "SLURM_ARRAY_TASK_STEP": "2",
                "SLURM_ARRAY_TASK_COUNT": "4",
            },
            (4, 3),
        ),
        (
            "auto",
            None,
            {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "3", "RANK": "0", "WORLD_SIZE": "9"},
            (3, 2),
        ),  # Slurm first, index and count from the same launcher
        ("16", None, {"JOB_COMPLETION_INDEX": "7", "RANK": "0", "WORLD_SIZE": "2"}, (16, 7)),
        ("auto", None, {"RANK": "3", "WORLD_SIZE": "4"}, (4, 3)),
        (None, 1, {"WORLD_SIZE": "2", "RANK": "0"}, (2, 1)),
    ],
)
def test_task_numbers_come_from_options_then_the_launcher(tasks, index, environ, expected):
    slot = task_slot(tasks, index, environ)
    assert (slot.tasks, slot.index) == expected if expected else slot is None


@pytest.mark.parametrize(
    ("tasks", "index", "environ", "needle"),
    [
        ("auto", None, {}, "no launcher numbers this task"),
        ("auto", None, {"JOB_COMPLETION_INDEX": "3"}, "give --tasks N"),
        ("4", None, {"RANK": "4", "WORLD_SIZE": "4"}, "out of range for 4 tasks (from --tasks 4)"),
        ("auto", None, {"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "2"}, "not a task index"),
        ("0", 0, {}, "--tasks must be a whole number"),
    ],
)
def test_bad_task_numbers_are_user_errors(tasks, index, environ, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        task_slot(tasks, index, environ)


def test_merge_refuses_a_tokenizer_changed_after_the_tasks(tmp_path, tiny_tokenizer):
    write_jsonl(tmp_path / "a.jsonl", make_documents(50, seed=35))
    out = tmp_path / "out"
    run_tasks([str(tmp_path / "a.jsonl")], out, 2, tokenizer=tiny_tokenizer)
    (out / ".tasks" / "tokenizer.json").write_text(tiny_tokenizer.read_text().replace('"model"', '"model" ', 1))
    before = tree_bytes(out)
    with pytest.raises(UserError, match=r"tokenizer\.json was changed by hand"):
        merge_tasks(out, workers=1, progress=False)
    assert tree_bytes(out) == before
