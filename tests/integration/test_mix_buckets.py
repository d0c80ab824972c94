"""data.mix and data.stages whose datasets are in a bucket, as a user chains the commands: `dlx prepare --out s3://…`
into `dlx pretrain --data.mix local=W,s3://…=W`, killed and resumed, against the same mixture prepared into local
folders (every loss and validation figure equal, bit for bit on CPU fp32). Then the mixture's loader itself: a bucket
source larger than its share of the cache bound, read by workers from the cache folder. The bucket is moto's S3 on
127.0.0.1 (`s3_helpers`)."""

from __future__ import annotations

import json

import pytest

from journey_helpers import TRAIN, User, kill_when_paused, stdlib_documents, step_losses, write_jsonl
from s3_helpers import apply_env, make_bucket, s3_server

BUCKET = "mixes"
TOKENIZER = json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}, "added_tokens": []})
RUN = [*TRAIN, "--train.max_steps", "12", "--checkpoint.every", "4", "--eval.every", "4", "--eval.batches", "2"]


@pytest.fixture(scope="module")
def bucket():
    with s3_server() as server:
        make_bucket(server, BUCKET)
        yield server


@pytest.fixture(scope="module")
def prepared(bucket, tmp_path_factory):
    """A user, `code` prepared into a local folder with its own tokenizer, and `prose` prepared with that tokenizer
    twice from one corpus: into the bucket, and into a local folder (the twin the bucket runs are compared with)."""
    home = tmp_path_factory.mktemp("mix")
    user = User(home / "user", bucket.env())
    documents = stdlib_documents(90)
    write_jsonl(home / "code.jsonl", [d for d in documents if d["id"].startswith("code/")])
    write_jsonl(home / "prose.jsonl", [d for d in documents if d["id"].startswith("prose/")])
    common = ["--val-documents", "6", "--no-progress"]
    user.dlx("prepare", str(home / "code.jsonl"), "--train-tokenizer", "512", "--out", "local/code", *common)
    tokenizer = ["--tokenizer", "local/code"]
    published = user.dlx("prepare", str(home / "prose.jsonl"), *tokenizer, "--out", f"s3://{BUCKET}/prose", *common)
    assert f"→ published s3://{BUCKET}/prose" in published.stderr
    user.dlx("prepare", str(home / "prose.jsonl"), *tokenizer, "--out", "twin/prose", *common)
    return user


def test_prepared_twice_the_bucket_and_the_local_prose_are_the_same_shards(prepared):
    bucket = json.loads(prepared.dlx("data", "info", f"s3://{BUCKET}/prose", "--json").stdout)
    local = json.loads(prepared.dlx("data", "info", "twin/prose", "--json").stdout)
    assert bucket["files"] == local["files"]  # names, sizes and SHA-256s: what the runs below compare is the place


def train_killed_and_resumed(user: User, args: list[str], run_dir: str, kill_at: int) -> str:
    """`dlx pretrain ARGS --resume auto` SIGKILLed before batch `kill_at`, once checkpoint 8 is published, then the
    same command to the end; the run's metrics.jsonl."""
    faults = user.home / f"faults-{run_dir}"
    faults.mkdir()
    command = ["pretrain", *args, "--run-dir", run_dir, "--resume", "auto"]
    first = user.start(*command, DLX_FAULT_PAUSE=f"train_batch@{kill_at}", DLX_FAULT_DIR=str(faults))
    checkpoint = user.home / run_dir / "checkpoints" / "step-00000008"
    kill_when_paused(first, faults / "train_batch", ready=checkpoint.is_dir)
    again = user.dlx(*command)
    assert "step 8" in again.stdout + again.stderr  # it resumed from the checkpoint, not from step 0
    return (user.home / run_dir / "metrics.jsonl").read_text()


def eval_records(user: User, run_dir: str) -> dict[int, dict]:
    lines = (user.home / run_dir / "eval.jsonl").read_text().splitlines()
    keys = ("loss", "bpb", "source_loss", "source_bpb")
    return {r["step"]: {k: r[k] for k in keys} for r in map(json.loads, lines)}


def test_a_mix_of_a_folder_and_a_bucket_trains_and_resumes_as_the_folders_do(prepared):
    user = prepared
    local = [*RUN, "--data.mix", "local/code=1,twin/prose=1"]
    whole = user.dlx("pretrain", *local, "--run-dir", "mix-local")
    remote = [*RUN, "--data.mix", f"local/code=1,s3://{BUCKET}/prose=1", "--data.cache_dir", "cache-mix"]
    resumed = train_killed_and_resumed(user, remote, "mix-bucket", kill_at=11)
    expected = step_losses((user.home / "mix-local" / "metrics.jsonl").read_text())
    assert sorted(expected) == list(range(1, 13)) and step_losses(resumed) == expected
    assert eval_records(user, "mix-bucket") == eval_records(user, "mix-local")  # each source's val split too
    assert set(eval_records(user, "mix-local")[12]["source_loss"]) == {"code", "prose"}
    assert "data order of" not in whole.stdout  # the bucket source fits the cache: the window shuffle
    (mirror,) = (user.home / "cache-mix").glob("prose-*")  # one mirror, one cache folder per split
    assert sorted(p.name for p in mirror.glob("shards-*")) == ["shards-train-rank0", "shards-val-rank0"]
    assert [p.name for p in mirror.glob("shards-train-rank0/*")] == ["train-00000.bin"]


def test_a_bucket_dataset_in_a_stage_s_mix_trains_and_resumes_as_the_folders_do(prepared):
    user = prepared
    stages = [{"until": 6}, {"mix": {"PROSE": 1}}]  # the bucket source in both stages: its pass carries on

    def staged(prose: str, extra: list[str]) -> list[str]:
        text = json.dumps(stages).replace("PROSE", prose)
        return [*RUN, "--data.mix", f"local/code=1,{prose}=2", "--data.stages", text, *extra]

    user.dlx("pretrain", *staged("twin/prose", []), "--run-dir", "stages-local")
    remote = staged(f"s3://{BUCKET}/prose", ["--data.cache_dir", "cache-stages"])
    resumed = train_killed_and_resumed(user, remote, "stages-bucket", kill_at=10)
    assert step_losses(resumed) == step_losses((user.home / "stages-local" / "metrics.jsonl").read_text())
    assert eval_records(user, "stages-bucket") == eval_records(user, "stages-local")
    (mirror,) = (user.home / "cache-stages").glob("prose-*")  # stage 1 opened while stage 0 read: a folder each
    assert sorted(p.name for p in mirror.glob("shards-*")) == [
        "shards-train-rank0",
        "shards-train-rank0.1",
        "shards-val-rank0",
    ]


def test_a_missing_dataset_in_a_mix_is_one_line_naming_it(prepared):
    result = prepared.dlx("pretrain", *RUN, "--data.mix", f"local/code=1,s3://{BUCKET}/nothing=1", ok=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: data.mix source s3://{BUCKET}/nothing is not a prepared dataset (manifest.json missing); "
        "run `dlx prepare` first"
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_bucket_source_over_its_share_of_the_cache_is_read_whole_each_pass_in_shard_blocks(
    bucket, tmp_path, monkeypatch, num_workers
):
    """Two sources of 8 shards each, one local, one in the bucket with a cache of 4 shards: the bucket source is read
    in shard blocks of 2 (its loader state says so), every window of it once before any repeats, the local one as
    from folders; the cache never holds more than its bound plus the shards of the batches in flight."""
    import numpy as np

    from dataset_helpers import write_dataset
    from dlx.data import storage
    from dlx.data.mixture import MixtureLoader
    from dlx.data.mixture.sources import mix_sources
    from dlx.data.remote import mirror_dataset
    from dlx.data.source import LoaderSettings

    apply_env(bucket, monkeypatch)
    shard_tokens, seq = 2000, 32
    for name, offset in (("a", 0), ("b", 20_000)):  # every token tells its source and place: offset + its position
        train = [np.arange(offset + i * shard_tokens, offset + (i + 1) * shard_tokens) for i in range(8)]
        write_dataset(tmp_path / name, {"train": train, "val": [np.arange(100, 400)]}, 1 << 16, tokenizer=TOKENIZER)
    url = f"s3://{BUCKET}/blocks-{num_workers}/b"
    storage.upload_tree(tmp_path / "b", url)
    settings = LoaderSettings(
        seq_len=seq, micro_batch_size=4, num_workers=num_workers, prefetch=2, cache_bytes=4 * shard_tokens * 2
    )
    sources = mix_sources({str(tmp_path / "a"): 1.0, url: 1.0}, tmp_path / "cache")
    mirror_dataset(url, tmp_path / "cache", "data.mix source")
    with MixtureLoader(sources, settings) as loader:
        assert loader.orders == {"a": "shuffled", "b": "shard-blocks-2"}
        assert loader.state_dict()["orders"] == [["a", "shuffled"], ["b", "shard-blocks-2"]]
        n_b = (8 * shard_tokens - 1) // seq
        firsts: dict[str, list[int]] = {"a": [], "b": []}
        while len(firsts["b"]) < n_b:
            inputs, _ = next(loader)
            for first in inputs[:, 0].tolist():
                firsts["b" if first >= 20_000 else "a"].append(first)
        windows = sorted((first - 20_000) // seq for first in firsts["b"][:n_b])
        assert windows == list(range(n_b))  # the bucket source's first pass: each window once
        cache = loader.caches[0]
        in_flight = max(1, num_workers * 2)  # batches sent ahead: their shards stay, over the bound if need be
        assert cache.peak_bytes <= max(4, 2 * in_flight + 2) * shard_tokens * 2
        assert cache.bytes_downloaded >= 8 * shard_tokens * 2  # every shard of the pass, through the cache
        assert cache.folder.name == "shards-train-rank0" and cache.folder.parent == sources[1].path.resolve()
        read = loader.verify_read_shards()  # the cached shards the batches read, checked before a checkpoint
        assert {f"train-{i:05d}.bin" for i in range(8)} <= set(read)
