"""The fault matrix, data: one flipped byte in a shard of a real prepared dataset (BPE tokenizer, uint16 shards).

`dlx data verify` and the loader with `verify=True` name the shard by its SHA-256 (test_prepare and test_loader check
the same on their own fixtures; here it is one cell of the matrix). A flip that leaves the token id inside the
vocabulary is invisible without the checksum; one that pushes it past the vocabulary (the high byte of a uint16 id)
must still be named by the run that reads it, not end in an embedding's IndexError."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlx.data.loader import TokenLoader
from dlx.errors import UserError
from dlx.train.recipe import load_recipe
from dlx.train.trainer import pretrain
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


def test_a_flipped_byte_is_named_by_data_verify_and_the_loader(tmp_path):
    folder = make_dataset(tmp_path / "data")
    assert run_cli(["data", "verify", str(folder)], tmp_path).returncode == 0
    flip(folder, 2 * TOKEN, 0x01)  # the low byte: still a valid token id
    result = run_cli(["data", "verify", str(folder)], tmp_path)
    assert result.returncode == 1
    assert SHARD in result.stderr and "checksum" in result.stderr and "Traceback" not in result.stderr
    assert "val-00000.bin" not in result.stderr
    with pytest.raises(UserError, match=f"{SHARD}: checksum mismatch") as error:
        TokenLoader(folder, seq_len=16, micro_batch_size=2, num_workers=0, verify=True)
    assert "\n" not in str(error.value)


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
            "--train.max_steps",
            "2",
        ],
    )
    with pytest.raises(UserError, match=SHARD) as error:
        pretrain(config, "t", tmp_path / "run")
    assert "\n" not in str(error.value)
