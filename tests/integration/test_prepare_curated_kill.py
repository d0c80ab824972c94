"""Kill -9 a curated `dlx prepare` (near dedup, quality, PII, languages) at the scan, in the encode pass, in a task
while it writes signatures and in the merge's deduplication: the same command, rerun, ends with the bytes of an
uninterrupted run, and no process of the killed tree outlives it. A one-machine curated run decides each document
once (the encode pass follows the scan's verdicts)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dlx.cli.prepare_command import source_labels
from dlx.data.curate.spec import build_spec
from dlx.data.curate.stages import Curator
from dlx.data.prepare import prepare_dataset, prepare_task
from fault_helpers import cli_env, committed
from prepare_helpers import HANZI, WORDS, folder_bytes, tiny_tokenizer, write_jsonl

__all__ = ["tiny_tokenizer"]

pytest.importorskip("py3langid")

CURATION = ["--dedup", "near", "--pii", "redact", "--languages", "zh,en", "--quality", "default"]


def _document(rng: random.Random) -> str:
    if rng.random() < 0.5:
        text = "".join(rng.choice(HANZI) + ("。" if rng.random() < 0.06 else "") for _ in range(rng.randint(120, 300)))
    else:
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 160))).capitalize() + "."
    if rng.random() < 0.1:
        text += f" mail me at user{rng.randrange(999)}@example.com or call 138{rng.randrange(10**8):08d}."
    return text


def _corpus(path: Path, n: int = 600) -> list[str]:
    rng = random.Random(11)
    docs = [_document(rng) for _ in range(n)]
    docs += [d.replace(d[10:14], "ABCD", 1) for d in rng.sample(docs, n // 5)]  # near copies
    docs += rng.sample(docs, n // 20)  # exact copies
    rng.shuffle(docs)
    return [str(write_jsonl(path, docs))]


def _kill_tree_when(cmd: list[str], ready, whole_tree: bool) -> bool:
    """Run cmd in a session of its own; once ready(), SIGKILL it (the whole process tree, or the parent alone, as an
    OOM killer or a scheduler does) and check no process of the tree is left. False when it finished first."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=cli_env(), start_new_session=True
    )
    deadline = time.monotonic() + 60
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if ready(proc):
                tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
                os.killpg(proc.pid, signal.SIGKILL) if whole_tree else proc.send_signal(signal.SIGKILL)
                proc.wait(30)
                alive = psutil.wait_procs(tree[1:], timeout=10)[1]
                assert not alive, f"processes outlived the killed prepare: {alive}"
                return True
            time.sleep(0.002)
        assert proc.wait(30) == 0, proc.stderr.read().decode()
        return False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        proc.stderr.close()


def _has_workers(proc: subprocess.Popen) -> bool:
    try:
        return bool(psutil.Process(proc.pid).children())
    except psutil.NoSuchProcess:
        return False


def test_sigkilled_curated_prepare_resumes_to_the_same_bytes(tmp_path, tiny_tokenizer):
    inputs = _corpus(tmp_path / "corpus.jsonl")
    base = [sys.executable, "-m", "dlx", "prepare", *inputs, "--tokenizer", str(tiny_tokenizer), "--no-progress"]
    base += ["--shard-tokens", "6000", "--val-fraction", "0.05", "--workers", "2", *CURATION]
    spec = build_spec(
        dedup="near", quality=True, pii="redact", languages=["zh", "en"], sources=source_labels(inputs, None)
    )
    options = dict(tokenizer=tiny_tokenizer, curate=spec, shard_tokens=6000, val_fraction=0.05, progress=False)
    prepare_dataset(inputs, tmp_path / "clean", workers=1, **options)
    clean = folder_bytes(tmp_path / "clean")
    assert any(name.startswith("val-") for name in clean) and len([n for n in clean if n.startswith("train-")]) > 3
    out = tmp_path / "one"
    cmd = [*base, "--out", str(out)]
    points = [  # (ready, kill the whole tree) in the order the run passes them
        (lambda p: _has_workers(p) and committed(out) is None, True),  # workers scanning
        (lambda p: (committed(out) or (True, 0))[1] >= 2 and not committed(out)[0], False),  # encode
    ]
    kills = sum(_kill_tree_when(cmd, ready, whole) for ready, whole in points)
    assert kills >= 2, "the corpus was too small to kill the run mid-way"
    assert subprocess.run(cmd, capture_output=True, timeout=60, env=cli_env()).returncode == 0
    assert folder_bytes(out) == clean

    split = tmp_path / "split"
    task = [*base, "--out", str(split), "--tasks", "2", "--task-index"]
    folder = split / ".tasks" / "task-00000"
    signing = lambda p: folder.is_dir() and any(f.suffix == ".sig" for f in folder.iterdir())  # noqa: E731
    assert _kill_tree_when([*task, "0"], signing, whole_tree=True), "the task ended before its first signatures"
    prepare_task(inputs, split, tasks=2, task_index=1, workers=1, **options)  # the other machine's task, not killed
    assert subprocess.run([*task, "0"], capture_output=True, timeout=60, env=cli_env()).returncode == 0
    merge = [sys.executable, "-m", "dlx", "prepare", "--merge", "--out", str(split), "--workers", "2", "--no-progress"]
    deciding = lambda p: (split / "curation-drops.npy").exists() or (split / "manifest.json").exists()  # noqa: E731
    assert _kill_tree_when(merge, deciding, whole_tree=False), "the merge ended before it was killed"
    assert subprocess.run(merge, capture_output=True, timeout=60, env=cli_env()).returncode == 0
    assert folder_bytes(split) == {k: v for k, v in clean.items()}


def test_a_one_machine_curated_run_runs_the_per_document_stages_once(tmp_path, tiny_tokenizer, monkeypatch):
    inputs = _corpus(tmp_path / "corpus.jsonl", n=300)
    calls = [0]
    real = Curator.process

    def counted(self, *args):
        calls[0] += 1
        return real(self, *args)

    monkeypatch.setattr(Curator, "process", counted)
    spec = build_spec(dedup="near", quality=True, pii="redact", languages=["zh", "en"])
    out = tmp_path / "out"
    prepare_dataset(inputs, out, tokenizer=tiny_tokenizer, curate=spec, val_fraction=0.05, workers=1, progress=False)
    manifest_bytes = (out / "manifest.json").read_bytes()
    n_docs = len(Path(inputs[0]).read_text().splitlines())
    assert calls[0] == n_docs
    assert b'"redacted"' in manifest_bytes
    assert not (tmp_path / "out" / "curation-verdicts.npy").exists()
