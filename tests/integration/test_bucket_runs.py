"""A run folder in a bucket through `dlx pretrain --run-dir s3://…`, as a user runs it, against moto's S3 behind the
fault proxy (`s3_helpers`): an outage keeps every verified checkpoint and the restart uploads them, one writer per
run (on one machine and across staging folders), a lease taken over after it lapses, uploads slower than the
checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from s3_helpers import Faults, apply_env, make_bucket, s3_server
from train_helpers import TINY, losses, make_dataset, train_quietly

BUCKET = "dlx-runs"


@pytest.fixture(scope="module")
def endpoint():
    with s3_server(Faults(seed=2)) as server:
        make_bucket(server, BUCKET)
        yield server


@pytest.fixture
def s3(endpoint, monkeypatch):
    apply_env(endpoint, monkeypatch)
    endpoint.faults.slowdown_rate = endpoint.faults.drop_rate = endpoint.faults.latency_s = 0.0
    yield endpoint
    endpoint.faults.slowdown_rate = endpoint.faults.drop_rate = endpoint.faults.latency_s = 0.0


def start(args: list[str], cwd, staging, pause: str | None = None, faults=None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DLX_STAGING_DIR": str(staging), "DLX_STORAGE_RETRY_S": "2"}
    env["DLX_SYNC_EVERY_S"] = "0.5"
    if pause:
        env |= {"DLX_FAULT_PAUSE": pause, "DLX_FAULT_DIR": str(faults)}
    return subprocess.Popen(
        [sys.executable, "-m", "dlx", "pretrain", *args], cwd=cwd, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def wait_for(path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def bucket_losses(url: str) -> dict[int, float]:
    from dlx.data import storage

    lines = storage.read_bytes(f"{url}/metrics.jsonl").decode().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def test_an_outage_keeps_every_verified_checkpoint_and_the_restart_uploads_them(s3, tmp_path):
    from dlx.train.rundir.remote import complete_checkpoints

    data = make_dataset(tmp_path / "data")
    run = [*TINY, "--data.path", str(data), "--train.max_steps", "8", "--checkpoint.every", "2", "--eval.every", "0"]
    train_quietly(run, tmp_path / "local")
    url = f"s3://{BUCKET}/outage"
    faults = tmp_path / "faults"
    faults.mkdir()
    command = [*run, "--run-dir", url, "--resume", "auto"]
    first = start(command, tmp_path, tmp_path / "staging", "train_batch@4", faults)
    wait_for(faults / "train_batch", first)
    s3.faults.drop_rate = 1.0  # the bucket goes away after step 3; training goes on from local data
    (faults / "train_batch").unlink()
    _, err = first.communicate(timeout=240)
    assert first.returncode == 2, err
    last = err.strip().splitlines()[-1]
    assert (
        last.startswith(f"error: the bucket {url} cannot be reached") and "checkpoint step-00000008 (verified)" in last
    )
    assert "Traceback" not in err and "aiohttp" not in err.replace(last, ""), err

    s3.faults.drop_rate = 0.0
    again = start(command, tmp_path, tmp_path / "staging")
    out, err = again.communicate(timeout=240)
    assert again.returncode == 0, err
    assert "holds checkpoint step-00000008 (verified), newer than the bucket's" in out + err
    assert complete_checkpoints(url)[0] == "step-00000008"
    assert bucket_losses(url) == losses(tmp_path / "local")  # no step lost beyond the last verified checkpoint


def test_two_launches_on_one_bucket_run_leave_exactly_one_writer(s3, tmp_path):
    data = make_dataset(tmp_path / "data")
    url = f"s3://{BUCKET}/two"
    command = [*TINY, "--data.path", str(data), "--train.max_steps", "6", "--eval.every", "0", "--run-dir", url]
    faults = tmp_path / "faults"
    faults.mkdir()
    first = start([*command, "--resume", "auto"], tmp_path, tmp_path / "staging", "train_batch@3", faults)
    wait_for(faults / "train_batch", first)
    here = start([*command, "--resume", "auto"], tmp_path, tmp_path / "staging")
    _, here_err = here.communicate(timeout=120)
    elsewhere = start([*command, "--resume", "auto"], tmp_path, tmp_path / "other-host-staging")
    _, elsewhere_err = elsewhere.communicate(timeout=120)
    (faults / "train_batch").unlink()
    _, err = first.communicate(timeout=240)
    assert first.returncode == 0, err
    assert here.returncode == 2 and f"run folder {url} is being trained by pid {first.pid} on this machine" in here_err
    assert elsewhere.returncode == 2 and f"is being trained by pid {first.pid} on " in elsewhere_err
    assert "its lease writer.lease was renewed" in elsewhere_err
    assert sorted(bucket_losses(url)) == [1, 2, 3, 4, 5, 6]
    from dlx.data import storage

    metrics = storage.read_bytes(f"{url}/metrics.jsonl").decode().splitlines()
    assert len(metrics) == 6  # every step once: the refused launches wrote nothing
    assert not storage.exists(f"{url}/writer.lease")  # given back at the end


def test_a_lapsed_lease_is_taken_over_and_a_live_one_is_respected(s3, monkeypatch):
    from dlx.data import storage
    from dlx.errors import UserError
    from dlx.train.rundir import lease as lease_module

    monkeypatch.setattr(lease_module, "SETTLE_S", 0.0)
    url = f"s3://{BUCKET}/lease"
    other = {"owner": "x", "host": "another-host", "pid": 4242, "lease_s": 60.0}
    storage.write_bytes(f"{url}/writer.lease", json.dumps({**other, "renewed": time.time() - 5}).encode())
    with pytest.raises(UserError, match="is being trained by pid 4242 on another-host"):
        lease_module.BucketLease(url).acquire()
    storage.write_bytes(f"{url}/writer.lease", json.dumps({**other, "renewed": time.time() - 3600}).encode())
    mine = lease_module.BucketLease(url)
    mine.acquire()
    assert json.loads(storage.read_bytes(f"{url}/writer.lease"))["owner"] == mine.owner
    storage.write_bytes(f"{url}/writer.lease", json.dumps({**other, "renewed": time.time()}).encode())
    with pytest.raises(lease_module.LeaseLost, match="another-host"):
        mine.renew()  # another launch took it: this one must stop uploading


def test_uploads_slower_than_the_checkpoints_still_complete_the_newest(s3, tmp_path):
    """Every request 0.3 s late (an upload takes seconds) and a checkpoint every step (milliseconds) with keep_last 1:
    the checkpoint being uploaded is never pruned, the newest is complete in the bucket at the end, and no prefix is
    left without its marker (whatever the machine's speed: which checkpoints are uploaded depends on it)."""
    from dlx.data import storage
    from dlx.train.rundir.remote import complete_checkpoints

    data = make_dataset(tmp_path / "data")
    url = f"s3://{BUCKET}/slow"
    s3.faults.latency_s = 0.3
    run = [*TINY, "--data.path", str(data), "--train.max_steps", "60", "--checkpoint.every", "1"]
    proc = start([*run, "--checkpoint.keep_last", "1", "--eval.every", "0", "--run-dir", url], tmp_path, tmp_path / "s")
    _, err = proc.communicate(timeout=400)
    s3.faults.latency_s = 0.0
    assert proc.returncode == 0, err
    assert complete_checkpoints(url)[0] == "step-00000060"
    prefixes = {name for name in storage.listdir(f"{url}/checkpoints") if name.startswith("step-")}
    assert prefixes == set(complete_checkpoints(url))  # every prefix in the bucket has its marker


def test_a_cached_shard_changed_in_place_is_downloaded_again_never_trained_on(s3, tmp_path):
    """The run pauses; one of its cached shards is overwritten (same size, other bytes); the run goes on: the changed
    file is found before its next use and downloaded again, so every loss equals the run from local data."""
    from dlx.data import storage

    data = make_dataset(tmp_path / "data")
    storage.upload_tree(data, f"s3://{BUCKET}/cached/data")
    run = [*TINY, "--train.max_steps", "12", "--eval.every", "0", "--data.num_workers", "0"]
    train_quietly([*run, "--data.path", str(data)], tmp_path / "local")
    cache = tmp_path / "cache"
    faults = tmp_path / "faults"
    faults.mkdir()
    remote = [*run, "--data.path", f"s3://{BUCKET}/cached/data", "--data.cache_dir", str(cache)]
    proc = start([*remote, "--run-dir", str(tmp_path / "remote")], tmp_path, tmp_path / "s", "train_batch@6", faults)
    wait_for(faults / "train_batch", proc)
    cached = sorted(cache.glob("*/shards-train-rank0/train-*.bin"))
    assert cached, "the run has cached shards"
    for shard in cached:
        shard.write_bytes(bytes(len(shard.read_bytes())))  # same size, every token 0
    (faults / "train_batch").unlink()
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert losses(tmp_path / "remote") == losses(tmp_path / "local")


def test_a_cached_shard_changed_after_it_was_read_stops_the_checkpoint(s3, tmp_path):
    from dlx.data import storage
    from dlx.data.loader.cache import ShardCache
    from dlx.data.shards import read_manifest
    from dlx.errors import UserError

    data = make_dataset(tmp_path / "data")
    url = f"s3://{BUCKET}/read/data"
    storage.upload_tree(data, url)
    shards = read_manifest(data).split_shards("train")
    cache = ShardCache(url, tmp_path / "c", shards, 2, 1 << 30)
    cache.start(iter([{shards[0].name}]), pinned=1)
    cache.acquire(0)
    cache.stop()
    path = tmp_path / "c" / shards[0].name
    path.write_bytes(bytes(path.stat().st_size))  # read by a batch, then changed
    changed = rf"shard {shards[0].name} in the cache folder .* changed after it was verified"
    with pytest.raises(UserError, match=changed):
        cache.verify_read()


def test_two_caches_never_share_a_cache_folder(tmp_path):
    from dlx.data.loader.cache import claim_cache_folder, release_cache_folder

    base = tmp_path / "mirror" / "shards-train-rank0"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from dlx.data.loader.cache import "
         "claim_cache_folder; print(claim_cache_folder(Path(sys.argv[1])), flush=True); time.sleep(60)", str(base)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == str(base)
        first = claim_cache_folder(base)
        assert first == base.with_name("shards-train-rank0.1")
        assert claim_cache_folder(base) == base.with_name("shards-train-rank0.2")  # another cache of this process
        release_cache_folder(first)
        assert claim_cache_folder(base) == first  # free again
    finally:
        holder.kill()
        holder.wait()


def test_a_checkpoint_published_during_an_upload_is_said_once_with_the_bandwidth(s3, tmp_path, monkeypatch, capsys):
    """While step 2's upload is in flight the run publishes step 4: the sync says uploads fall behind (once), uploads
    the newest next, and the checkpoint it was uploading was not pruned meanwhile."""
    from dlx.data import storage
    from dlx.train.rundir import sync as sync_module
    from dlx.train.rundir.checkpoint import prune_checkpoints

    staging = tmp_path / "run"
    for step in (2,):
        (staging / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)
        (staging / "checkpoints" / f"step-{step:08d}" / "model.safetensors").write_bytes(b"w" * 1000)
    (staging / "config.yaml").write_text("a: 1\n")
    monkeypatch.setattr(sync_module, "list_checkpoints", lambda folder: sorted((folder / "checkpoints").iterdir()))
    real_upload_tree = storage.upload_tree

    def publishing_meanwhile(local, url):
        newer = staging / "checkpoints" / "step-00000004"
        if not newer.exists():
            newer.mkdir()
            (newer / "model.safetensors").write_bytes(b"v" * 1000)
            prune_checkpoints(staging, keep_last=1)  # the run's retention, while step 2 uploads: it stays (pinned)
            assert (staging / "checkpoints" / "step-00000002").is_dir()
        return real_upload_tree(local, url)

    monkeypatch.setattr(storage, "upload_tree", publishing_meanwhile)
    url = f"s3://{BUCKET}/behind"
    sync_module.RunSync(url, staging).sync(while_training=True)
    err = capsys.readouterr().err
    assert err.count("fall behind") == 1 and "step-00000004 was published while step-00000002 uploaded at" in err
    assert "MB/s to the bucket" in err
    assert storage.exists(f"{url}/checkpoints/step-00000002/COMPLETE")
