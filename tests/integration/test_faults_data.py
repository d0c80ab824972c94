"""The fault matrix, data: one flipped byte in a shard of a real prepared dataset (BPE tokenizer, uint16 shards).

`dlx data verify` and a training run (its loader workers verify each shard's SHA-256) name the shard (test_prepare,
test_loader and test_loader_workers check the same on their own fixtures; here it is one cell of the matrix). A flip
that leaves the token id inside the vocabulary is invisible without the checksum; one that pushes it past the
vocabulary (the high byte of a uint16 id) must be named by the run that reads it even with data.verify off, not end
in an embedding's IndexError. A shard truncated while a loader worker has it mapped kills the worker (SIGBUS): the
run ends with the worker's stack and one line naming it, and leaves no process behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dlx.errors import UserError
from dlx.train.loop.trainer import pretrain
from dlx.train.recipe import load_recipe
from fault_helpers import cli_env, finish, left_running, process_tree, start_cli, wait_for_file
from train_helpers import TINY, make_dataset, run_cli

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("in_process_training")]

SHARD = "train-00000.bin"
TOKEN = 20
"""The flipped token: in the first window, so the first step reads it (unshuffled)."""


def flip(folder: Path, offset: int, bit: int) -> None:
    path = folder / SHARD
    data = bytearray(path.read_bytes())
    data[offset] ^= bit
    path.write_bytes(bytes(data))


def test_a_flipped_byte_is_named_by_data_verify_and_the_run(tmp_path):
    folder = make_dataset(tmp_path / "data")
    assert run_cli(["data", "verify", str(folder)], tmp_path).returncode == 0
    flip(folder, 2 * TOKEN, 0x01)  # the low byte: still a valid token id
    result = run_cli(["data", "verify", str(folder)], tmp_path)
    assert result.returncode == 1
    assert SHARD in result.stderr and "checksum" in result.stderr and "Traceback" not in result.stderr
    assert "val-00000.bin" not in result.stderr
    run = [*TINY, "--data.path", str(folder), "--data.num_workers", "1", "--train.max_steps", "50"]
    result = run_cli(["pretrain", *run, "--run-dir", str(tmp_path / "run")], tmp_path)
    assert result.returncode == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert f"shard {SHARD} does not match the checksum" in line and f"dlx data verify {folder}" in line
    assert "Traceback" not in result.stderr


def test_a_flipped_byte_past_the_vocabulary_is_named_by_the_run(tmp_path):
    folder = make_dataset(tmp_path / "data")
    flip(folder, 2 * TOKEN + 1, 0x80)  # the high byte: id + 32768, past the 300-token vocabulary
    config = load_recipe(
        None,
        [
            *TINY,
            "--data.path",
            str(folder),
            "--data.shuffle",
            "false",
            "--data.num_workers",
            "0",
            "--data.verify",
            "false",
            "--train.max_steps",
            "2",
        ],
    )
    with pytest.raises(UserError, match=SHARD) as error:
        pretrain(config, "t", tmp_path / "run")
    assert "\n" not in str(error.value)


def test_a_shard_truncated_under_a_worker_ends_the_run_with_one_line_naming_it(tmp_path):
    """The worker compares the shard's size before it reads a batch from its map, so the truncation is named in one
    line (exit 2) instead of the worker dying of SIGBUS."""
    folder = make_dataset(tmp_path / "data")
    run = [*TINY, "--data.path", str(folder), "--data.num_workers", "1", "--train.max_steps", "40"]
    env = cli_env(DLX_FAULT_PAUSE="train_batch@3", DLX_FAULT_DIR=str(tmp_path))
    proc = start_cli(["pretrain", *run, "--run-dir", str(tmp_path / "run")], tmp_path, env=env, plots=False)
    wait_for_file(tmp_path / "train_batch", proc)
    processes = process_tree(proc.pid)  # the trainer and its loader worker
    assert len(processes) == 2
    os.truncate(folder / SHARD, 0)
    (tmp_path / "train_batch").unlink()
    _, err = finish(proc)
    assert proc.returncode == 2, err
    last = err.rstrip().splitlines()[-1]
    assert last.startswith("error: dataset ") and f"shard {SHARD} shrank from" in last, err
    assert "dlx data verify" in last and "Traceback" not in err and "Bus error" not in err
    assert left_running(processes, timeout=5) == []
