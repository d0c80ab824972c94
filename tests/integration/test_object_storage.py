"""Object storage (`dlx.data.storage`, the shard cache, prepare and checkpoints in a bucket) against a real S3 server
on 127.0.0.1 (moto) behind a proxy that adds 503 SlowDown and dropped connections (`s3_helpers`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dataset_helpers import write_dataset
from s3_helpers import Faults, apply_env, make_bucket, s3_server
from train_helpers import TINY, losses, make_dataset, run_cli, train_quietly

BUCKET = "dlx-test"


@pytest.fixture(scope="module")
def endpoint():
    with s3_server(Faults(seed=1)) as server:
        make_bucket(server, BUCKET)
        yield server


@pytest.fixture
def s3(endpoint, monkeypatch):
    """The server's environment in this process; the proxy passes every request until a test sets faults."""
    from dlx.data import storage

    apply_env(endpoint, monkeypatch)
    monkeypatch.setenv(storage.RETRY_ENV, "20")
    endpoint.faults.slowdown_rate = endpoint.faults.drop_rate = 0.0
    yield endpoint
    endpoint.faults.slowdown_rate = endpoint.faults.drop_rate = 0.0


def test_retries_throttling_and_dropped_connections_then_names_the_object(s3, monkeypatch, tmp_path):
    from dlx.data import storage
    from dlx.errors import UserError

    storage.write_bytes(f"s3://{BUCKET}/retry/a.bin", b"x" * 1000)
    s3.faults.slowdown_rate, s3.faults.drop_rate = 0.3, 0.2
    before = s3.faults.slowdowns + s3.faults.drops
    for i in range(5):
        assert storage.read_bytes(f"s3://{BUCKET}/retry/a.bin") == b"x" * 1000
        assert storage.download(f"s3://{BUCKET}/retry/a.bin", tmp_path / f"{i}.bin") >= 1000
    assert s3.faults.slowdowns + s3.faults.drops > before  # faults happened and were retried
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{i}.bin" for i in range(5)]  # no temporary file left
    s3.faults.slowdown_rate = 1.0
    monkeypatch.setenv(storage.RETRY_ENV, "0.5")
    with pytest.raises(UserError, match=rf"s3://{BUCKET}/retry/a.bin: gave up after \d+ tries"):
        storage.read_bytes(f"s3://{BUCKET}/retry/a.bin")


def test_a_download_that_does_not_match_its_checksum_leaves_nothing(s3, tmp_path):
    from dlx.data import storage
    from dlx.errors import UserError

    storage.write_bytes(f"s3://{BUCKET}/sum/a.bin", b"abc")
    with pytest.raises(UserError, match="does not match the checksum"):
        storage.download(f"s3://{BUCKET}/sum/a.bin", tmp_path / "a.bin", sha256="0" * 64)
    assert list(tmp_path.iterdir()) == []


def test_missing_bucket_and_credentials_are_one_line(s3, monkeypatch):
    from dlx.data import storage
    from dlx.errors import UserError

    with pytest.raises(UserError, match="bucket no-such-bucket does not exist"):
        storage.check_access("s3://no-such-bucket/data", "data.path")


def _shard_dataset(folder, n_shards=8, tokens=3000):
    rng = np.random.default_rng(0)
    train = [rng.integers(1, 250, tokens) for _ in range(n_shards)]
    return write_dataset(folder, {"train": train, "val": [rng.integers(1, 250, 2000)]}, 256)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_from_a_bucket_gives_the_local_batches_within_its_cache_bound(s3, tmp_path, num_workers):
    from dlx.data import storage
    from dlx.data.loader import TokenLoader
    from dlx.data.remote import mirror_dataset
    from dlx.data.source import LoaderSettings

    local = _shard_dataset(tmp_path / "ds")
    url = f"s3://{BUCKET}/loader-{num_workers}/ds"
    storage.upload_tree(local, url)
    shard_bytes = 3000 * 2
    settings = LoaderSettings(
        seq_len=32, micro_batch_size=2, num_workers=num_workers, prefetch=2, cache_bytes=6 * shard_bytes
    )
    s3.faults.slowdown_rate, s3.faults.drop_rate = 0.02, 0.02
    mirror = mirror_dataset(url, tmp_path / "cache")
    with (
        TokenLoader(local, settings, "train", loop=False) as a,
        TokenLoader(mirror, settings, "train", loop=False) as b,
    ):
        expected = torch.cat([x.clone() for x, _ in a])
        got = torch.cat([x.clone() for x, _ in b])
        assert b.order == "shard-blocks-3" and a.order == "shuffled"  # 8 shards through a cache of 6
        assert len(got) == len(expected) == a.batches_per_epoch * 2
        got_rows, expected_rows = set(map(tuple, got.tolist())), set(map(tuple, expected.tolist()))
        assert len(got_rows) == len(got)  # no window twice in the epoch
        assert len(got_rows - expected_rows) <= 749 % 2  # the same windows but each order's skipped tail
        pinned = 2 * num_workers * 2 + 2  # the shards of the batches in flight may exceed the bound
        assert b.cache.peak_bytes <= max(6, pinned) * shard_bytes
        assert 8 * shard_bytes <= b.cache.bytes_downloaded <= (8 + 3) * shard_bytes  # + ≤ 1 per block edge


@pytest.mark.parametrize("downloads", [1, 4])
def test_the_cache_keeps_its_downloads_in_flight_at_once_within_its_bound(s3, tmp_path, monkeypatch, downloads):
    import threading

    from dlx.data import storage
    from dlx.data.loader.cache import ShardCache
    from dlx.data.shards import read_manifest

    local = _shard_dataset(tmp_path / "ds", n_shards=12)
    url = f"s3://{BUCKET}/in-flight-{downloads}/ds"
    storage.upload_tree(local, url)
    lock, now, most = threading.Lock(), [0], [0]
    real_download = storage.download

    def counted(*args, **kwargs):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        try:
            return real_download(*args, **kwargs)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(storage, "download", counted)
    s3.faults.latency_s = 0.1  # round-trip bound: downloads overlap only when several are in flight
    shards = read_manifest(local).split_shards("train")
    shard_bytes = 3000 * 2
    cache = ShardCache(url, tmp_path / "cache", shards, 2, 8 * shard_bytes, downloads=downloads)
    order = [{s.name} for s in shards] * 2  # every shard twice, in the same order
    try:
        cache.start(iter(order), pinned=1)
        for position, names in enumerate(order):
            cache.acquire(position)
            assert names <= cache.present.keys()
            for name in names:  # what the trainer reads is the manifest's shard, whole
                assert (tmp_path / "cache" / name).read_bytes() == (local / name).read_bytes()
    finally:
        cache.stop()
        s3.faults.latency_s = 0.0
    assert most[0] == downloads
    assert cache.peak_bytes <= 8 * shard_bytes
    # 12 shards, 8 fit: at least 4 download again on the second visit (Belady's optimum), never one twice per visit;
    # a prefetch that judged next uses only within the batches it had scanned downloaded all 12 again
    assert 16 * shard_bytes <= cache.bytes_downloaded <= (18 if downloads == 1 else 22) * shard_bytes
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.endswith(".tmp")]


def test_a_cache_left_by_a_killed_run_is_verified_not_trusted(s3, tmp_path):
    from dlx.data import storage
    from dlx.data.loader.cache import ShardCache
    from dlx.data.shards import read_manifest

    local = _shard_dataset(tmp_path / "ds", n_shards=3)
    storage.upload_tree(local, f"s3://{BUCKET}/killed/ds")
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / ".train-00000.bin.x1y2.tmp").write_bytes(b"half a download")
    (folder / "train-00001.bin").write_bytes((local / "train-00001.bin").read_bytes())  # whole: kept
    damaged = bytearray((local / "train-00002.bin").read_bytes())
    damaged[10] ^= 1
    (folder / "train-00002.bin").write_bytes(bytes(damaged))  # same size, other bytes: deleted
    shards = read_manifest(local).split_shards("train")
    cache = ShardCache(f"s3://{BUCKET}/killed/ds", folder, shards, 2, 1 << 30)
    assert sorted(p.name for p in folder.iterdir()) == ["train-00001.bin"]
    assert list(cache.present) == ["train-00001.bin"]


def test_a_local_checkpoint_that_does_not_verify_is_not_resumed_over_the_bucket(s3, tmp_path, monkeypatch):
    from dlx.data import storage
    from dlx.train.rundir.remote import newest_verified, pull_run, staging_dir

    monkeypatch.setenv("DLX_STAGING_DIR", str(tmp_path / "staging"))
    url = f"s3://{BUCKET}/runs/never-uploaded"
    storage.write_bytes(storage.join(url, "config.yaml"), b"model: {}\n")
    storage.write_bytes(storage.join(url, "metrics.jsonl"), b'{"step": 1, "loss": 9.0}\n')
    staging = staging_dir(url)
    (staging / "checkpoints" / "step-00000008").mkdir(parents=True)  # no trainer_state.json: not a whole checkpoint
    (staging / "config.yaml").write_text("model: {}\n")
    (staging / "metrics.jsonl").write_text("".join(f'{{"step": {i}, "loss": 9.0}}\n' for i in range(1, 11)))
    assert pull_run(url) == staging and newest_verified(staging) is None
    assert (staging / "metrics.jsonl").read_text() == '{"step": 1, "loss": 9.0}\n'  # the bucket's run wins


def test_a_verified_local_checkpoint_newer_than_the_bucket_is_kept_and_said(s3, tmp_path, monkeypatch):
    """A run trained here while the bucket got nothing (no config.yaml in it): its staging folder is kept whole."""
    from dlx.data import storage
    from dlx.train.rundir.remote import newest_verified, pull_run, staging_dir

    monkeypatch.setenv("DLX_STAGING_DIR", str(tmp_path / "staging"))
    url = f"s3://{BUCKET}/runs/outage"
    staging = staging_dir(url)
    data = make_dataset(tmp_path / "data")
    train_quietly([*TINY, "--data.path", str(data), "--train.max_steps", "4", "--checkpoint.every", "2"], staging)
    metrics = (staging / "metrics.jsonl").read_bytes()
    said = []
    assert pull_run(url, say=said.append) == staging
    assert newest_verified(staging).name == "step-00000004" and (staging / "metrics.jsonl").read_bytes() == metrics
    assert said == [
        f"run folder {url}: this machine's staging folder {staging} holds checkpoint step-00000004 (verified), newer "
        "than the bucket's (none): it is uploaded before training goes on"
    ]
    assert not storage.exists(storage.join(url, "config.yaml"))  # pulling uploads nothing: the sync does


def test_pretrain_from_a_bucket_matches_a_local_run(s3, tmp_path):
    from dlx.data import storage

    local = make_dataset(tmp_path / "data")
    storage.upload_tree(local, f"s3://{BUCKET}/train/data")
    common = [*TINY, "--train.max_steps", "4", "--eval.every", "2", "--eval.batches", "2", "--data.num_workers", "1"]
    train_quietly([*common, "--data.path", str(local)], tmp_path / "local")
    s3.faults.slowdown_rate = 0.02
    remote = ["--data.path", f"s3://{BUCKET}/train/data", "--data.cache_dir", str(tmp_path / "cache")]
    train_quietly([*common, *remote], tmp_path / "remote")
    assert losses(tmp_path / "remote") == losses(tmp_path / "local")


def test_pretrain_from_a_missing_bucket_is_one_line_exit_2(s3, tmp_path):
    result = run_cli(["pretrain", *TINY, "--data.path", "s3://no-such-bucket/data", "--run-dir", "r"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: data.path s3://no-such-bucket/data: bucket no-such-bucket does not exist; create it or fix the URL"
    ]
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_prepare_from_a_bucket_into_a_bucket_equals_a_local_prepare(s3, tmp_path, monkeypatch):
    import inspect
    import json

    from dlx.data import storage

    monkeypatch.setenv("DLX_STAGING_DIR", str(tmp_path / "staging"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, module in enumerate((json.decoder, json.encoder, inspect)):
        (corpus / f"{i}.jsonl").write_text(json.dumps({"text": inspect.getsource(module)}) + "\n")
        storage.upload(corpus / f"{i}.jsonl", f"s3://{BUCKET}/corpus/{i}.jsonl")
    options = ["--train-tokenizer", "300", "--val-documents", "1", "--workers", "1", "--no-progress"]
    local = run_cli(["prepare", str(corpus), *options, "--out", "local"], tmp_path)
    assert local.returncode == 0, local.stderr
    s3.faults.slowdown_rate = s3.faults.drop_rate = 0.02
    url = f"s3://{BUCKET}/prepared/web"
    remote = run_cli(["prepare", f"s3://{BUCKET}/corpus/*.jsonl", *options, "--out", url], tmp_path, timeout=180)
    assert remote.returncode == 0, remote.stderr
    for name in sorted(
        p.name for p in (tmp_path / "local").iterdir() if p.suffix == ".bin" or p.name == "tokenizer.json"
    ):
        assert storage.read_bytes(storage.join(url, name)) == (tmp_path / "local" / name).read_bytes(), name
    published = json.loads(storage.read_bytes(storage.join(url, "manifest.json")))
    assert published["shards"] == json.loads((tmp_path / "local" / "manifest.json").read_text())["shards"]


def test_prepare_into_a_missing_bucket_is_one_line_exit_2(s3, tmp_path):
    result = run_cli(["prepare", "--corpus", "stdlib", "--out", "s3://no-such-bucket/x"], tmp_path)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: --out s3://no-such-bucket/x: bucket no-such-bucket does not exist; create it or fix the URL"
    )


@pytest.mark.slow
def test_checkpoints_in_a_bucket_resume_on_a_fresh_machine_and_export(s3, tmp_path, monkeypatch):
    import json
    import shutil

    from dlx.data import storage
    from dlx.train.rundir.remote import complete_checkpoints

    monkeypatch.setenv("DLX_STAGING_DIR", str(tmp_path / "staging"))
    data = make_dataset(tmp_path / "data")
    command = [
        *TINY,
        "--data.path",
        str(data),
        "--eval.every",
        "0",
        "--checkpoint.every",
        "2",
        "--train.max_steps",
        "4",
    ]
    train_quietly(command, tmp_path / "local")
    url = f"s3://{BUCKET}/runs/r1"
    s3.faults.slowdown_rate = s3.faults.drop_rate = 0.02
    first = run_cli(["pretrain", *command, "--run-dir", url, "--resume", "auto"], tmp_path)
    assert first.returncode == 0, first.stderr
    assert complete_checkpoints(url) == ["step-00000004", "step-00000002"]
    storage.remove(storage.join(url, "checkpoints", "step-00000004", "COMPLETE"))  # its upload was cut short
    shutil.rmtree(tmp_path / "staging")  # another machine: nothing local
    second = run_cli(["pretrain", *command, "--run-dir", url, "--resume", "auto"], tmp_path)
    assert second.returncode == 0, second.stderr
    assert "step-00000002" in second.stdout + second.stderr  # resumed from the newest complete checkpoint
    assert complete_checkpoints(url) == ["step-00000004", "step-00000002"]
    metrics = storage.read_bytes(storage.join(url, "metrics.jsonl")).decode().splitlines()
    remote_losses = {r["step"]: r["loss"] for r in map(json.loads, metrics)}
    assert remote_losses == losses(tmp_path / "local")  # steps 1-2 before the restart, 3-4 after: bit for bit
    shutil.rmtree(tmp_path / "staging")
    export = run_cli(["export-hf", url, str(tmp_path / "hf")], tmp_path)
    assert export.returncode == 0, export.stderr
    assert (tmp_path / "hf" / "config.json").is_file()


def _objects(endpoint, prefix: str) -> list[str]:
    """The keys under `prefix` as moto holds them, asked past the proxy (no latency, no faults)."""
    import boto3

    env = endpoint.env()
    client = boto3.client(
        "s3",
        endpoint_url=endpoint.server_url,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    return [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


def _kill_mid_checkpoint_upload(endpoint, command: list[str], cwd, prefix: str, timeout_s: float = 90) -> list[str]:
    """Start `dlx pretrain COMMAND` held before its first batch (`dlx.faults`) until its run files are in the bucket,
    then SIGKILL its process group once a checkpoint's files are there without their marker (an upload in flight);
    the keys the bucket held then."""
    import os
    import signal
    import subprocess
    import sys
    import time

    faults = cwd / "faults"
    faults.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DLX_FAULT_PAUSE": "train_batch", "DLX_FAULT_DIR": str(faults)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlx", "pretrain", *command],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            keys = _objects(endpoint, prefix)
            if f"{prefix}/config.yaml" in keys and (faults / "train_batch").exists():
                (faults / "train_batch").unlink()  # the run files were sent before step 1: train on
            started = {k.split("/")[-2] for k in keys if "/checkpoints/" in k}
            marked = {k.split("/")[-2] for k in keys if k.endswith("/COMPLETE")}
            if f"{prefix}/config.yaml" in keys and started - marked:
                os.killpg(proc.pid, signal.SIGKILL)
                return keys
            time.sleep(0.05)
        raise AssertionError(f"no checkpoint upload was seen in flight (exit {proc.poll()})")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_a_run_killed_mid_checkpoint_upload_resumes_with_the_same_command(s3, tmp_path, monkeypatch):
    """A real SIGKILL of the training process while a checkpoint's upload is in flight (every request through the
    proxy slowed down), then the same command: it resumes and its losses are those of an uninterrupted local run."""
    import json

    from dlx.data import storage

    monkeypatch.setenv("DLX_STAGING_DIR", str(tmp_path / "staging"))
    rng = np.random.default_rng(3)
    data = write_dataset(tmp_path / "data", {"train": [rng.integers(1, 300, 4000) for _ in range(2)]}, 300)
    command = [*TINY, "--data.path", str(data), "--eval.every", "0", "--checkpoint.every", "2"]
    command += ["--train.max_steps", "8"]
    train_quietly(command, tmp_path / "local")
    url = f"s3://{BUCKET}/runs/killed"
    remote = [*command, "--run-dir", url, "--resume", "auto"]
    s3.faults.latency_s = 0.25
    try:
        held = _kill_mid_checkpoint_upload(s3, remote, tmp_path, url.partition(f"{BUCKET}/")[2])
    finally:
        s3.faults.latency_s = 0.0
    assert held  # killed with the run's files and part of a checkpoint in the bucket
    second = run_cli(["pretrain", *remote], tmp_path)
    assert second.returncode == 0, second.stderr
    assert storage.read_bytes(storage.join(url, "tokenizer.json")) == (data / "tokenizer.json").read_bytes()
    metrics = storage.read_bytes(storage.join(url, "metrics.jsonl")).decode().splitlines()
    assert {r["step"]: r["loss"] for r in map(json.loads, metrics)} == losses(tmp_path / "local")


def test_run_sync_sends_whole_changed_files_before_checkpoints(s3, tmp_path, monkeypatch):
    import os

    from dlx.data import storage
    from dlx.train.rundir import sync as remote_run

    staging = tmp_path / "run"
    (staging / "checkpoints" / "step-00000002").mkdir(parents=True)
    (staging / "checkpoints" / "step-00000002" / "model.safetensors").write_bytes(b"w" * 100)
    (staging / "config.yaml").write_text("a: 1\n")
    (staging / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2')  # a record being appended
    (staging / ".tokenizer.json.x1.tmp").write_text("{")  # an atomic write in progress
    monkeypatch.setattr(remote_run, "list_checkpoints", lambda folder: sorted((folder / "checkpoints").iterdir()))
    url = f"s3://{BUCKET}/sync/run"
    sent = []
    real_write, real_upload = storage.write_bytes, storage.upload
    monkeypatch.setattr(storage, "write_bytes", lambda u, d: (sent.append(storage.basename(u)), real_write(u, d)))
    monkeypatch.setattr(storage, "upload", lambda p, u: (sent.append(storage.basename(u)), real_upload(p, u)))
    sync = remote_run.RunSync(url, staging)
    sync.sync()
    assert sent == ["config.yaml", "metrics.jsonl", "model.safetensors", "COMPLETE"]
    assert storage.read_bytes(storage.join(url, "metrics.jsonl")) == b'{"step": 1}\n'
    assert not storage.exists(storage.join(url, ".tokenizer.json.x1.tmp"))
    sent.clear()
    sync.sync()
    assert sent == []  # nothing changed: nothing sent again
    with open(staging / "metrics.jsonl", "a") as f:
        f.write("}\n")
    os.utime(staging / "config.yaml", ns=(1, 1))  # only an mtime changes: sent again
    sync.sync()
    assert sent == ["config.yaml", "metrics.jsonl"]
    assert storage.read_bytes(storage.join(url, "metrics.jsonl")) == b'{"step": 1}\n{"step": 2}\n'


def test_pretrain_through_a_smaller_cache_says_it_reads_in_shard_blocks(s3, tmp_path):
    from dlx.data import storage

    local = _shard_dataset(tmp_path / "ds")
    storage.upload_tree(local, f"s3://{BUCKET}/blocks/ds")
    cache = ["--data.cache_dir", str(tmp_path / "cache"), "--data.cache_gb", str(4 * 3000 * 2 / 1e9)]
    command = ["pretrain", *TINY, "--data.path", f"s3://{BUCKET}/blocks/ds", *cache, "--train.max_steps", "2"]
    result = run_cli([*command, "--eval.every", "0", "--run-dir", "r"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "data order: shard-blocks-2 (the dataset is larger than data.cache_gb" in result.stdout
