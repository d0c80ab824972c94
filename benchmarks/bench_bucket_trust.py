"""A run folder in a bucket under faults, measured from outside through `dlx pretrain --run-dir s3://…` against moto's
S3 on 127.0.0.1 behind the fault proxy (tests/s3_helpers.py):

- outage: the bucket goes away mid-run and comes back; the same command is run again (`--resume auto`, the restart
  loop). Measured: the newest verified checkpoint this machine kept, and the steps trained again after the restart
  beyond it (the target is 0 beyond the last verified checkpoint).
- two launches on one run URL, 1 s and 11 s apart, and from two staging folders (two hosts): how many trained, and
  how many records per step the bucket's metrics.jsonl holds.
- upload lag: every request body held at 1 MB/s (an uplink); for each checkpoint, the seconds from its local publish
  (trainer_state.json written) to its `COMPLETE` marker in the bucket, against the interval between checkpoints.

    python benchmarks/bench_bucket_trust.py [--no-record]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
from peers.record import Headline, environment, publish  # noqa: E402
from s3_helpers import Faults, make_bucket, s3_server  # noqa: E402
from train_helpers import TINY, make_dataset  # noqa: E402

BUCKET = "trust"
INTRO = "Measured by `benchmarks/bench_bucket_trust.py`; see its docstring."


def start(args: list[str], endpoint, staging: Path, cwd: Path, **env: str) -> subprocess.Popen:
    """`dlx pretrain ARGS`; its output goes to files in `cwd` (a pipe nobody reads would block a long run), read
    back by `finish`."""
    full = {**os.environ, **endpoint.env(), "OMP_NUM_THREADS": "1", "DLX_STAGING_DIR": str(staging), **env}
    cwd.mkdir(parents=True, exist_ok=True)
    out = open(cwd / f"out-{time.monotonic_ns()}", "w+")  # noqa: SIM115 (closed by finish)
    err = open(cwd / f"err-{time.monotonic_ns()}", "w+")  # noqa: SIM115 (closed by finish)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlx", "pretrain", *args], cwd=cwd, env=full, text=True,
        stdout=out, stderr=err, start_new_session=True,
    )  # fmt: skip
    proc.files = (out, err)  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[str, str]:
    """Wait for `proc`; its standard output and error."""
    proc.wait(timeout)
    texts = []
    for f in proc.files:  # type: ignore[attr-defined]
        f.seek(0)
        texts.append(f.read())
        f.close()
    return texts[0], texts[1]


def bucket_steps(url: str) -> list[int]:
    from dlx.data import storage

    try:
        lines = storage.read_bytes(f"{url}/metrics.jsonl").decode().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line)["step"] for line in lines]


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{path.name} never appeared: {finish(proc)[1][-2000:]}")
        time.sleep(0.05)


def outage(endpoint, data: Path, work: Path) -> dict:
    """Steps 1-6 with the bucket up, then none; the same command again once it is back."""
    from dlx.train.rundir.remote import newest_verified, staging_dir

    url = f"s3://{BUCKET}/outage"
    run = [*TINY, "--data.path", str(data), "--train.max_steps", "12", "--checkpoint.every", "2", "--eval.every", "0"]
    command = [*run, "--run-dir", url, "--resume", "auto"]
    faults = work / "faults"
    faults.mkdir(parents=True)
    staging = work / "staging"
    first = start(command, endpoint, staging, work, DLX_FAULT_PAUSE="train_batch@7", DLX_FAULT_DIR=str(faults),
                  DLX_STORAGE_RETRY_S="2")  # fmt: skip
    wait_for(faults / "train_batch", first)
    endpoint.faults.drop_rate = 1.0
    (faults / "train_batch").unlink()
    _, err = finish(first)
    endpoint.faults.drop_rate = 0.0
    os.environ["DLX_STAGING_DIR"] = str(staging)
    kept = newest_verified(staging_dir(url))
    second = start(command, endpoint, staging, work)
    out, _ = finish(second)
    retrained = [r for r in out.splitlines() if r.startswith("step ")]
    return {
        "first exit": first.returncode,
        "last line": err.strip().splitlines()[-1][:160],
        "kept": kept.name if kept else "none",
        "second exit": second.returncode,
        "steps in the bucket": len(set(bucket_steps(url))),
        "steps trained again": len(retrained),
    }


def two_launches(endpoint, data: Path, work: Path, apart_s: float, other_host: bool) -> dict:
    work.mkdir(parents=True)
    url = f"s3://{BUCKET}/two-{apart_s:g}-{int(other_host)}"
    run = [*TINY, "--data.path", str(data), "--train.max_steps", "30", "--eval.every", "0"]
    command = [*run, "--run-dir", url, "--resume", "auto"]
    first = start(command, endpoint, work / "staging-a", work)
    time.sleep(apart_s)
    second = start(command, endpoint, work / ("staging-b" if other_host else "staging-a"), work)
    results = [finish(p) for p in (first, second)]
    steps = bucket_steps(url)
    return {
        "trained (exit 0)": sum(p.returncode == 0 for p in (first, second)),
        "refused (exit 2)": sum(p.returncode == 2 for p in (first, second)),
        "refusal": next(
            (
                err.strip().splitlines()[-1][:140]
                for p, (_, err) in zip((first, second), results, strict=True)
                if p.returncode == 2
            ),
            "none",
        ),
        "records per step": max(steps.count(s) for s in set(steps)) if steps else 0,
        "steps": len(set(steps)),
    }


def upload_lag(endpoint, data: Path, work: Path, bytes_per_s: float) -> dict:
    """Seconds from a checkpoint's local publish to its marker in the bucket, each checkpoint."""
    from dlx.data import storage

    work.mkdir(parents=True)
    url = f"s3://{BUCKET}/lag"
    staging_root = work / "staging-lag"
    run = [*TINY, "--data.path", str(data), "--train.max_steps", "3000", "--checkpoint.every", "500"]
    run += ["--eval.every", "0", "--log.every", "100"]
    endpoint.faults.upload_bytes_per_s = bytes_per_s
    proc = start([*run, "--run-dir", url], endpoint, staging_root, work)
    published: dict[str, float] = {}
    complete: dict[str, float] = {}
    while proc.poll() is None:  # the command ends after its last upload
        now = time.time()
        for state in staging_root.glob("runs/*/checkpoints/step-*/trainer_state.json"):
            published.setdefault(state.parent.name, state.stat().st_mtime)
        for name in [n for n in published if n not in complete]:
            if storage.exists(f"{url}/checkpoints/{name}/COMPLETE"):
                complete[name] = now
        time.sleep(0.2)
    endpoint.faults.upload_bytes_per_s = 0.0
    _, err = finish(proc)
    names = sorted(published)
    interval = [published[b] - published[a] for a, b in itertools.pairwise(names)]
    lags = {name: complete[name] - published[name] for name in names if name in complete}
    size = sum(p.stat().st_size for p in (staging_root.glob(f"runs/*/checkpoints/{names[-1]}/*")) if p.is_file())
    return {
        "checkpoints published here": len(names),
        "checkpoints complete in the bucket": len(complete),
        "checkpoint MB": f"{size / 1e6:.2f}",
        "lag s (median, max)": f"{sorted(lags.values())[len(lags) // 2]:.2f}, {max(lags.values()):.2f}"
        if lags
        else "—",
        "interval s (median)": f"{sorted(interval)[len(interval) // 2]:.2f}" if interval else "—",
        "newest complete": max(complete) if complete else "none",
        "said behind": "fall behind" in err,
    }


def main() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    header = environment(["src/dlx/train/rundir", "src/dlx/data/loader/cache.py", "benchmarks/bench_bucket_trust.py"])
    with tempfile.TemporaryDirectory() as tmp, s3_server(Faults(seed=5)) as endpoint:
        make_bucket(endpoint, BUCKET)
        for key, value in endpoint.env().items():
            os.environ[key] = value
        work = Path(tmp)
        data = make_dataset(work / "data")
        o = outage(endpoint, data, work / "o")
        launches = {
            (apart, host): two_launches(endpoint, data, work / f"t{apart}{host}", apart, host)
            for apart, host in ((1.0, False), (11.0, False), (1.0, True))
        }
        lag = upload_lag(endpoint, data, work / "l", 1e6)
    lines = [f"### {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "", *header, ""]
    lines += ["| scenario | measure | value |", "|---|---|---|"]
    lines += [f"| outage, then the same command | {k} | {v} |" for k, v in o.items()]
    for (apart, host), r in launches.items():
        where = "two staging folders (two hosts)" if host else "one machine"
        lines += [f"| two launches {apart:g} s apart, {where} | {k} | {v} |" for k, v in r.items()]
    lines += [f"| checkpoint uploads at 1 MB/s | {k} | {v} |" for k, v in lag.items()]
    writers = max(r["trained (exit 0)"] for (apart, _), r in launches.items() if apart < 5)  # at the same time
    headline = Headline(
        f"outage: {o['steps trained again']} steps retrained beyond the kept checkpoint {o['kept']}; two launches: "
        f"{writers} writer when 1 s apart (one machine, two hosts); uploads at 1 MB/s: lag "
        f"{lag['lag s (median, max)']} s (median, max)",
        "—",
        "—",
    )
    publish("Trust", INTRO, lines, record=not args.no_record, headline=headline)


if __name__ == "__main__":
    main()
