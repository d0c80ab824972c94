"""A dataset is one list of files: the manifest names each with its size and SHA-256 (a manifest written before the
list derives it from its tokenizer and token-bytes hashes), `verify_shards` checks every listed file, and messages
name a bucket's URL where they would name its local staging folder."""

from __future__ import annotations

import json

import pytest

from dlx.data.prepare import prepare_dataset
from dlx.data.shards import Manifest, read_manifest, verify_shards
from journey_helpers import stdlib_documents, write_jsonl


@pytest.fixture
def dataset(tmp_path):
    """A dataset `dlx prepare` writes (one worker: in this process)."""
    corpus = write_jsonl(tmp_path / "corpus.jsonl", stdlib_documents(12))
    prepare_dataset([str(corpus)], tmp_path / "data", train_tokenizer=300, workers=1, progress=False)
    return tmp_path / "data"


def test_a_manifest_lists_every_file_and_verify_checks_each(dataset):
    manifest = read_manifest(dataset)
    listed = {entry.name for entry in manifest.dataset_files()}
    on_disk = {p.name for p in dataset.iterdir() if p.name != "manifest.json"}
    assert listed <= on_disk and {s.name for s in manifest.shards} <= listed and "tokenizer.json" in listed
    assert verify_shards(dataset) == []
    (dataset / "tokenizer.json").write_text((dataset / "tokenizer.json").read_text() + " ")
    assert verify_shards(dataset, hash_files=False)[0].startswith("tokenizer.json: ")  # its size is recorded too
    assert verify_shards(dataset)[0].startswith("tokenizer.json: ")


def test_a_manifest_written_before_the_list_derives_it():
    raw = {
        "dtype": "uint16",
        "vocab_size": 10,
        "eos_id": 0,
        "tokenizer_sha256": "a" * 64,
        "token_bytes_sha256": "b" * 64,
    }
    raw["shards"] = [{"name": "train-00000.bin", "split": "train", "tokens": 5, "documents": 1, "sha256": "c" * 64}]
    entries = [(e.name, e.bytes, e.sha256[0]) for e in Manifest.model_validate(raw).dataset_files()]
    assert entries == [("tokenizer.json", None, "a"), ("token_bytes.npy", None, "b"), ("train-00000.bin", 10, "c")]


def test_a_listed_file_outside_the_folder_is_refused(dataset):
    raw = json.loads((dataset / "manifest.json").read_text())
    raw["files"][0]["name"] = "../secrets"
    with pytest.raises(ValueError, match="not a file name inside the dataset folder"):
        Manifest.model_validate(raw)


def test_messages_name_the_bucket_except_where_they_name_this_machine(tmp_path):
    from dlx.data import storage

    storage.stage_as(tmp_path / "stage", "s3://bucket/run")
    text = f"run folder {tmp_path}/stage/checkpoints; the staging folder {tmp_path}/stage keeps step 8"
    assert (
        storage.shown(text)
        == f"run folder s3://bucket/run/checkpoints; the staging folder {tmp_path}/stage keeps step 8"
    )
