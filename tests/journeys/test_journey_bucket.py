"""J1, the whole path through a bucket: a raw JSON corpus in S3 → a curated `dlx prepare` into the bucket → `dlx data
info` and `verify` of the URL → `dlx pretrain` from the bucket with its run folder in the bucket → SIGKILL → the same
command → every loss equal to an uninterrupted run's → `dlx eval` and `dlx export-hf` from the bucket → transformers
generates what `dlx generate` does. Each step reads what the command before it wrote; the only thing made by hand is
the raw corpus, which no dlx command makes. The server is moto's S3 on 127.0.0.1 (`s3_helpers`)."""

from __future__ import annotations

import json

import pytest

from journey_helpers import TRAIN, User, kill_when_paused, stdlib_documents, step_losses, write_jsonl
from s3_helpers import apply_env, make_bucket, s3_server

pytestmark = pytest.mark.journey
BUCKET = "journey"


@pytest.fixture(scope="module")
def bucket():
    with s3_server() as server:
        make_bucket(server, BUCKET)
        yield server


def read(url: str) -> str:
    from dlx.data import storage

    return storage.read_bytes(url).decode()


def exists(url: str) -> bool:
    from dlx.data import storage

    return storage.exists(url)


def test_a_raw_corpus_in_a_bucket_to_a_model_transformers_runs(bucket, tmp_path, monkeypatch):
    from dlx.data import storage

    apply_env(bucket, monkeypatch)  # this process reads the bucket as the user's commands do
    user = User(tmp_path / "user", bucket.env())
    corpus = stdlib_documents(120)
    corpus += [dict(d, id=d["id"] + "#copy") for d in corpus[:6]]  # exact copies: deduplication removes them
    raw = write_jsonl(tmp_path / "raw" / "corpus.jsonl", corpus)
    storage.upload(raw, f"s3://{BUCKET}/raw/corpus.jsonl")

    data = f"s3://{BUCKET}/data/stdlib"
    prepared = user.dlx(
        "prepare", f"s3://{BUCKET}/raw/", "--out", data, "--train-tokenizer", "512", "--dedup", "near",
        "--pii", "redact", "--val-documents", "8", "--no-progress",
    )  # fmt: skip
    assert prepared.stderr.strip().splitlines()[-1].startswith("prepared ")
    assert f"→ published {data}" in prepared.stderr.strip().splitlines()[-1]
    assert "staging" not in "\n".join(prepared.stderr.strip().splitlines()[:-1])  # the bucket is named, not the cache

    info = json.loads(user.dlx("data", "info", data, "--json").stdout)
    assert info["complete"] and {"tokenizer.json", "token_bytes.npy", "curation.md", "curation-removed.jsonl"} <= set(
        info["files"]
    )
    assert info["curation"]["total"]["removed"][0] >= 6  # documents: at least the exact copies
    verified = user.dlx("data", "verify", data)
    assert verified.stdout.startswith(f"{data}: ") and "match the manifest" in verified.stdout

    run = [*TRAIN, "--data.path", data, "--train.max_steps", "12", "--checkpoint.every", "4", "--eval.every", "6"]
    whole = f"s3://{BUCKET}/runs/whole"
    user.dlx("pretrain", *run, "--run-dir", whole)
    killed = f"s3://{BUCKET}/runs/killed"
    faults = tmp_path / "faults"
    faults.mkdir()
    first = user.start(
        "pretrain", *run, "--run-dir", killed, "--resume", "auto",
        DLX_FAULT_PAUSE="train_batch@11", DLX_FAULT_DIR=str(faults),
    )  # fmt: skip
    checkpoint_8 = f"{killed}/checkpoints/step-00000008/COMPLETE"
    kill_when_paused(first, faults / "train_batch", ready=lambda: exists(checkpoint_8))
    again = user.dlx("pretrain", *run, "--run-dir", killed, "--resume", "auto")
    assert "step 8" in again.stdout + again.stderr  # it resumed from the bucket's checkpoint
    expected = step_losses(read(f"{whole}/metrics.jsonl"))
    assert sorted(expected) == list(range(1, 13))
    assert step_losses(read(f"{killed}/metrics.jsonl")) == expected

    evaluated = user.dlx("eval", killed, "--tasks", "dlx_stdlib_next_line", "--limit", "8", "--json")
    assert "checkpoint step 12" in evaluated.stderr
    assert "dlx_stdlib_next_line" in json.loads(evaluated.stdout)["results"]
    exported = user.dlx("export-hf", killed, "hf")
    assert "checkpoint step 12" in exported.stdout
    prompt = "import os\n"
    ours = user.dlx("generate", killed, "--prompt", prompt, "--max-new-tokens", "12", "--temperature", "0").stdout
    theirs = user.python(
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained('hf'); model = AutoModelForCausalLM.from_pretrained('hf')\n"
        f"ids = tok({prompt!r}, return_tensors='pt').input_ids\n"
        "out = model.generate(ids, max_new_tokens=12, do_sample=False)\n"
        "print(tok.decode(out[0], skip_special_tokens=True))\n"
    )
    assert theirs.strip() == ours.strip()
