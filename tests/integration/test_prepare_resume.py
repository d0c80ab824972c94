"""Kill -9 `dlx prepare` mid-run, rerun it: the output is byte for byte that of an uninterrupted run, and no worker
outlives its parent."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from dlx.data.prepare import prepare_dataset
from fault_helpers import committed as _committed
from fault_helpers import signal_after_progress
from prepare_helpers import folder_bytes, make_documents, prepare_command, tiny_tokenizer, write_jsonl

__all__ = ["tiny_tokenizer"]


def _kill_after_progress(cmd, out, min_next_unit: int) -> tuple[bool, list[psutil.Process]]:
    """Start prepare; SIGKILL it once the manifest has committed `min_next_unit` units. (killed?, its workers)."""
    proc, tree = signal_after_progress(cmd, out, min_next_unit, "SIGKILL")
    return proc is not None, tree[1:]


def test_sigkill_then_rerun_gives_identical_bytes(tmp_path, tiny_tokenizer):
    write_jsonl(tmp_path / "a.jsonl", make_documents(2500, seed=5))
    write_jsonl(tmp_path / "b.jsonl", make_documents(500, seed=6))
    inputs = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    out = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "dlx",
        "prepare",
        *inputs,
        "--out",
        str(out),
        "--tokenizer",
        str(tiny_tokenizer),
        "--shard-tokens",
        "3000",
        "--val-fraction",
        "0.05",
        "--workers",
        "2",
        "--no-progress",
    ]
    kills = 0
    for min_next_unit in (0, 5, 12, 25):
        killed, workers = _kill_after_progress(cmd, out, min_next_unit)
        if not killed:
            break
        kills += 1
        assert workers, "the run had worker processes"
        alive = psutil.wait_procs(workers, timeout=10)[1]
        assert not alive, f"workers outlived their killed parent: {alive}"
    assert kills >= 2, "the corpus was too small to kill the run mid-way"
    if _committed(out) != (True, -1):
        finish = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert finish.returncode == 0, finish.stderr
    clean = tmp_path / "clean"
    prepare_dataset(
        inputs, clean, tokenizer=tiny_tokenizer, shard_tokens=3000, val_fraction=0.05, workers=1, progress=False
    )
    assert folder_bytes(out) == folder_bytes(clean)
    assert len(folder_bytes(clean)) > 10


def test_rerun_over_finished_output_does_no_work(tmp_path, tiny_tokenizer):
    write_jsonl(tmp_path / "a.jsonl", make_documents(100, seed=7))
    out = tmp_path / "out"
    args = dict(tokenizer=tiny_tokenizer, shard_tokens=1000, workers=1, progress=False)
    first = prepare_dataset([str(tmp_path / "a.jsonl")], out, **args)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    second = prepare_dataset([str(tmp_path / "a.jsonl")], out, **args)
    assert second == first
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps


def test_sigterm_stops_workers_and_the_run_resumes(tmp_path, tiny_tokenizer):
    write_jsonl(tmp_path / "a.jsonl", make_documents(1500, seed=8))
    out = tmp_path / "out"
    options = ("--shard-tokens", "2000", "--workers", "2", "--no-progress")
    cmd = prepare_command(tmp_path / "a.jsonl", out, tiny_tokenizer, *options)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while (state := _committed(out)) is None or (not state[0] and state[1] < 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1].decode()
        time.sleep(0.005)
    workers = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    assert not psutil.wait_procs(workers, timeout=10)[1]
    assert subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
    assert _committed(out) == (True, -1)


def test_concurrent_runs_on_one_folder_queue_and_agree(tmp_path, tiny_tokenizer):
    write_jsonl(tmp_path / "a.jsonl", make_documents(600, seed=9))
    out = tmp_path / "out"
    options = ("--shard-tokens", "2000", "--workers", "1", "--no-progress")
    cmd = prepare_command(tmp_path / "a.jsonl", out, tiny_tokenizer, *options)
    runs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors = [run.communicate(timeout=120)[1] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], errors
    assert sum("nothing to do" in e for e in errors) == 1
    clean = tmp_path / "clean"
    prepare_dataset(
        [str(tmp_path / "a.jsonl")], clean, tokenizer=tiny_tokenizer, shard_tokens=2000, workers=1, progress=False
    )
    assert folder_bytes(out) == folder_bytes(clean)
