"""Object storage: dlx reading datasets from and writing runs and datasets to an S3 server on 127.0.0.1 (moto) behind
the tests' fault proxy (`tests/s3_helpers.py`: 50 ms per request, 1 % of requests answered 503 SlowDown).

1. An epoch over a dataset twice the cache size: bytes downloaded ÷ dataset bytes, Belady vs LRU in the same run, in
   the shuffled order training uses and in file order (data.shuffle false).
2. SIGKILL during `dlx pretrain` from a bucket (data and run folder there; from step 10 on, once the bucket holds a
   complete checkpoint), then the same command: seconds until its first step, losses against an uninterrupted local
   run; the bucket run's data wait share of the step, and the download rate measured in 1. (4 downloads in flight)
   projected onto llama3.2-1b's H200 step rate (69k tokens/s).
3. `dlx prepare` of one corpus from and into the bucket against local disk.

    .venv/bin/python benchmarks/bench_object_storage.py [--no-record]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
from dataset_helpers import write_dataset  # noqa: E402
from peers.record import environment, publish  # noqa: E402
from s3_helpers import Faults, make_bucket, s3_server  # noqa: E402

SECTION = "Object storage"
INTRO = (
    "`benchmarks/bench_object_storage.py`: moto's S3 server on 127.0.0.1 behind the tests' fault proxy (50 ms added to "
    "every request, 1 % answered 503 SlowDown). Ratios are measured within one run on the shared 2-core machine."
)
WATCHED = ["src/dlx/data", "src/dlx/train/rundir/remote.py", "benchmarks/bench_object_storage.py"]
BUCKET = "dlx-bench"
H200_TOKENS_PER_S = 69_000
DOWNLOADS = 4
"""data.cache_downloads's default; one row reads with a single download at a time, as the prefetch did before."""
EPOCHS = [(shuffle, policy, DOWNLOADS) for shuffle in (False, True) for policy in ("belady", "lru")]
EPOCHS.append((True, "belady", 1))
"""(data.shuffle, the cache policy, downloads in flight) of each epoch row."""


def word_tokenizer() -> str:
    """A real tokenizer.json of the demo's 8,192 ids (a word-level vocabulary): the run folder keeps and checks it."""
    from tokenizers import Tokenizer, models

    return Tokenizer(models.WordLevel({f"t{i}": i for i in range(8192)}, unk_token="t0")).to_str()


def epoch_ratio(
    url: str, local: Path, cache: Path, policy: str, shuffle: bool, downloads: int
) -> tuple[float, float, str]:
    """(bytes downloaded ÷ dataset bytes, download MB/s, the loader's order) for one epoch with a cache of half the
    dataset (64 shards: the shuffled order is in blocks of 16), `downloads` shards in flight at once."""
    from dlx.data.loader import TokenLoader
    from dlx.data.remote import mirror_dataset
    from dlx.data.shards import read_manifest
    from dlx.data.source import LoaderSettings

    manifest = read_manifest(local)
    dataset_bytes = manifest.split_tokens("train") * 2
    mirror = mirror_dataset(url, cache / f"{policy}-{shuffle}-{downloads}")
    settings = LoaderSettings(
        seq_len=256,
        micro_batch_size=4,
        num_workers=0,
        shuffle=shuffle,
        cache_bytes=dataset_bytes // 2,
        cache_policy=policy,
        cache_downloads=downloads,
    )
    loader = TokenLoader(mirror, settings, "train", loop=False)
    start = time.perf_counter()
    n = sum(1 for _ in loader)
    elapsed = time.perf_counter() - start
    loader.close()
    assert n == loader.batches_per_epoch
    return loader.cache.bytes_downloaded / dataset_bytes, loader.cache.bytes_downloaded / elapsed / 1e6, loader.order


def dlx_command(args: list[str], env: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dlx", *args],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # a refusal's one line goes to stderr: read and shown like the steps
        start_new_session=True,
    )


def run_until(
    proc: subprocess.Popen, stop_at_step: int | None, ready: Callable[[], bool] = lambda: True
) -> tuple[float | None, int]:
    """Read the run's console: seconds until its first step line, and the last step seen; SIGKILL the process group
    at the first step line from `stop_at_step` on at which `ready()` holds."""
    start, first, last = time.perf_counter(), None, 0
    for line in proc.stdout:
        TAIL.append(line)
        if os.environ.get("BENCH_VERBOSE") or line.startswith("error"):
            print(line, end="", flush=True)
        if line.startswith("step "):
            last = int(line.split()[1])
            first = first if first is not None else time.perf_counter() - start
            if stop_at_step is not None and last >= stop_at_step and ready():
                os.killpg(proc.pid, signal.SIGKILL)
                break
    proc.wait()
    if os.environ.get("BENCH_VERBOSE"):
        print("exit", proc.returncode, flush=True)
    return first, last


TAIL: list[str] = []
"""Every console line of the runs, for the reason a run failed."""


def losses_of(lines: list[str]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def kill_and_resume(endpoint, data_url: str, local_data: Path, work: Path) -> dict:
    from dlx.data import storage
    from dlx.train.rundir.remote import complete_checkpoints

    env = {**os.environ, **endpoint.env(), "DLX_STAGING_DIR": str(work / "staging"), "OMP_NUM_THREADS": "1"}
    common = shlex.split(
        "--model.preset demo --data.seq_len 256 --data.micro_batch_size 4 --train.max_steps 16"
        " --checkpoint.every 4 --eval.every 0 --log.every 1 --log.progress false"
        " --train.precision fp32"
    )
    proc = dlx_command(["pretrain", *common, "--data.path", str(local_data), "--run-dir", "local"], env, work)
    run_until(proc, None)
    reference = losses_of((work / "local" / "metrics.jsonl").read_text().splitlines())
    run_url = f"s3://{BUCKET}/runs/demo"
    remote = [
        "pretrain",
        *common,
        "--data.path",
        data_url,
        "--data.cache_dir",
        str(work / "cache"),
        "--run-dir",
        run_url,
        "--resume",
        "auto",
    ]
    os.environ.update(endpoint.env())
    in_bucket = lambda: bool(complete_checkpoints(run_url))  # noqa: E731 - the kill comes after an upload
    first_start, killed_at = run_until(dlx_command(remote, env, work), stop_at_step=10, ready=in_bucket)
    complete = complete_checkpoints(run_url)
    restart_s, last = run_until(dlx_command(remote, env, work), None)
    if restart_s is None:
        reason = next((line for line in reversed(TAIL) if "error" in line.lower()), TAIL[-1] if TAIL else "")
        print("the resumed run failed:", "".join(TAIL[-20:]), flush=True)
        return {
            "killed_at": killed_at,
            "complete_then": complete[0] if complete else "none",
            "first_start_s": first_start or float("nan"),
            "restart_s": float("nan"),
            "last": last,
            "identical": f"not measured: the resumed run failed ({reason.strip()[:150]})",
            "wait_median": float("nan"),
            "wait_mean": float("nan"),
            "wait_warm_mean": float("nan"),
        }
    lines = storage.read_bytes(storage.join(run_url, "metrics.jsonl")).decode().splitlines()
    records = [json.loads(line) for line in lines]
    resumed_at = int(complete[0].removeprefix("step-")) if complete else 0
    waits = [r["data_wait_pct"] for r in records if "data_wait_pct" in r]
    warm = [r["data_wait_pct"] for r in records if "data_wait_pct" in r and r["step"] not in (1, resumed_at + 1)]
    return {
        "killed_at": killed_at,
        "complete_then": complete[0] if complete else "none",
        "first_start_s": first_start,
        "restart_s": restart_s,
        "last": last,
        "identical": losses_of(lines) == reference,
        "wait_median": float(np.median(waits)),
        "wait_mean": float(np.mean(waits)),
        "wait_warm_mean": float(np.mean(warm)),
    }


def prepare_timings(endpoint, work: Path) -> tuple[float, float, int]:
    from dlx.data import storage

    corpus = work / "corpus"
    corpus.mkdir()
    import email
    import json as json_module
    import textwrap
    import typing

    sources = [inspect.getsource(m) for m in (json_module.decoder, textwrap, typing, email.message, inspect)]
    for i in range(8):
        lines = [json.dumps({"text": text + f"\n# copy {i}.{j}"}) for j, text in enumerate(sources)]
        (corpus / f"{i}.jsonl").write_text("\n".join(lines) + "\n")
        storage.upload(corpus / f"{i}.jsonl", f"s3://{BUCKET}/corpus/{i}.jsonl")
    size = sum(p.stat().st_size for p in corpus.iterdir())
    env = {**os.environ, **endpoint.env(), "DLX_STAGING_DIR": str(work / "pstaging")}
    options = ["--train-tokenizer", "1000", "--val-documents", "2", "--workers", "1", "--no-progress"]
    timings = []
    for inputs, out in ((str(corpus), str(work / "prepared")), (f"s3://{BUCKET}/corpus/*.jsonl", f"s3://{BUCKET}/p")):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "dlx", "prepare", inputs, *options, "--out", out],
            env=env,
            cwd=work,
            check=True,
            capture_output=True,
        )
        timings.append(time.perf_counter() - start)
    return timings[0], timings[1], size


def measure(work: Path) -> tuple[dict, dict, tuple[float, float, int], Faults]:
    """The epoch rows, the kill-and-resume run and the prepare timings, against one server (everything under `work`)."""
    rng = np.random.default_rng(0)
    local = write_dataset(
        work / "data",
        {"train": [rng.integers(1, 8192, 4096) for _ in range(64)], "val": [rng.integers(1, 8192, 4096)]},
        8192,
        tokenizer=word_tokenizer(),  # a resumed run compares the run folder's copy with the dataset's
    )
    with s3_server(Faults(latency_s=0.0, seed=0)) as endpoint:
        os.environ.update(endpoint.env())
        make_bucket(endpoint, BUCKET)
        from dlx.data import storage

        data_url = f"s3://{BUCKET}/data/random"
        storage.upload_tree(local, data_url)
        endpoint.faults.latency_s, endpoint.faults.slowdown_rate = 0.05, 0.01
        ratios = {
            (policy, shuffle, downloads): epoch_ratio(data_url, local, work / "epoch", policy, shuffle, downloads)
            for shuffle, policy, downloads in EPOCHS
        }
        kill = kill_and_resume(endpoint, data_url, local, work)
        local_s, remote_s, corpus_bytes = prepare_timings(endpoint, work)
        faults = endpoint.faults
    return ratios, kill, (local_s, remote_s, corpus_bytes), faults


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true", help="Print only; leave BENCHMARKS.md as it is.")
    args = parser.parse_args()
    header = environment(WATCHED)
    with tempfile.TemporaryDirectory(prefix="bench-object-storage-") as name:
        ratios, kill, (local_s, remote_s, corpus_bytes), faults = measure(Path(name))
    rate = max(r[1] for key, r in ratios.items() if key[2] == DOWNLOADS)  # MB/s of the best-fed epoch
    need = H200_TOKENS_PER_S * 2 / 1e6  # MB/s of uint16 tokens, each downloaded once
    lines = [
        *header,
        "",
        "| measure | value |",
        "|---|---|",
        *(
            f"| epoch over 64 shards, cache = ½ dataset, order {ratios[key][2]}, {key[0]}, {key[2]} in flight: "
            f"downloaded ÷ dataset, MB/s | {ratios[key][0]:.2f}, {ratios[key][1]:.2f} |"
            for key in ratios
        ),
        f"| demo from the bucket: data wait share of the step, median (mean; mean without each start's first step, "
        f"whose shards no prefetch could fetch earlier) | {kill['wait_median']:.2f} % ({kill['wait_mean']:.2f} %; "
        f"{kill['wait_warm_mean']:.2f} %) |",
        f"| projected at {H200_TOKENS_PER_S:,} tokens/s: {need:.3f} MB/s needed ÷ {rate:.2f} MB/s measured with "
        f"{DOWNLOADS} in flight (prefetch busy share; < 100 % keeps ahead, then the wait is the demo's) "
        f"| {100 * need / rate:.1f} % |",
        f"| SIGKILL at step {kill['killed_at']} (bucket's newest complete checkpoint then: {kill['complete_then']}); "
        f"same command: seconds to its first step | {kill['restart_s']:.1f} s "
        f"(first start {kill['first_start_s']:.1f} s) |",
        f"| losses of the killed + resumed bucket run, steps 1-{kill['last']}, equal to an uninterrupted local run "
        f"| {kill['identical']} |",
        f"| dlx prepare {corpus_bytes / 1e6:.1f} MB of JSON lines: local → local, bucket → bucket | {local_s:.1f} s, "
        f"{remote_s:.1f} s ({local_s / remote_s:.2f}× local throughput) |",
        f"| proxy: requests, 503s, dropped | {faults.requests}, {faults.slowdowns}, {faults.drops} |",
    ]
    publish(SECTION, INTRO, lines, record=not args.no_record)


if __name__ == "__main__":
    main()
