"""The whole device session in one call: `run_gpu_bench.py --check` (llama3.2-1b MFU, compile off and on, fixed costs),
micro-batches past the check's (16–32, compile on, grad accum 1 and 4), then what had never run on a GPU: document
masking's cost (flex_attention) at llama3.2-1b's shape, and a `dlx pretrain` of the demo recipe that goes through
every CUDA path a run takes (pinned-memory loader workers, NVML counters, document mask, profiler with the allocator's
memory snapshot, evaluation, samples, checkpoints, a resume, `dlx generate`).

On a lent device machine (its own torch, no network, only what is under $OUT comes back), from the repository root:

    run(command="DLX_GIT_SHA=<sha> python3 benchmarks/gpu/first_contact.py", carry=["benchmarks/gpu/wheels"],
        timeout_s=600)

Each step has its own time limit (600 s in all; the steps took 330 s on an H200), so that one that hangs cannot eat
the others'. Everything goes into a work folder;
at the end at most 8 files go to $OUT (the device tool brings back no more): the check's entry.md and run.log, the
document-mask table, the pretrain log, a tarball of the run folder without its checkpoints' weights, the steps' log
and summary.txt (one line per step: status, seconds, the figure it gives). Back here:
`python benchmarks/gpu/run_gpu_bench.py --record FILES_AT` appends the check's entry to BENCHMARKS.md.
`--dry-run` prints the steps and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]
import offline_deps  # noqa: E402
import run_gpu_bench  # noqa: E402  (puts src/ and benchmarks/ on sys.path)

ROOT = run_gpu_bench.ROOT
DOCMASK_SHAPE = ("--seq-len", "2048", "--micro-batch", "8", "--precision", "bf16", "--steps", "5", "--warmup", "2")
LARGE_BATCHES = (
    *("bench", "--model", "llama3.2-1b", "--seq-len", "2048", "--micro-batch", "16,24,32", "--grad-accum", "1,4"),
    *("--precision", "bf16", "--steps", "5", "--warmup", "2", "--compile"),
)
"""Past the check's micro-batch 16, compiled: where the MFU tops out, and what accumulation adds."""
DEMO_RUN = (
    *("--data.num_workers", "2", "--data.document_mask", "true", "--log.every", "10"),
    *("--profile.start", "12", "--profile.steps", "2", "--eval.every", "20", "--eval.batches", "5"),
    *("--eval.sample_every", "20", "--eval.sample_prompts", '["def "]', "--checkpoint.every", "20"),
)


def steps(work: Path) -> list[tuple[str, list[str], float]]:
    """(name, argv, seconds allowed) in the order they run; the most wanted figure first."""
    python, data, run, check = sys.executable, work / "data" / "stdlib-8k", work / "run", work / "check"
    prepare = f"from dlx.train.demo import prepare_demo_data; prepare_demo_data(__import__('pathlib').Path('{data}'))"
    docmask = [python, "-m", "dlx", "bench", "--model", str(work / "llama3.2-1b-vocab8k.json"), "--data", str(data)]
    docmask += [*DOCMASK_SHAPE, "--out", str(work / "docmask")]
    demo = [python, "-m", "dlx", "pretrain", str(ROOT / "recipes" / "demo.yaml"), "--run-dir", str(run)]
    demo += ["--data.path", str(data), *DEMO_RUN]
    return [
        ("check", [python, str(HERE / "run_gpu_bench.py"), "--check", "--budget-s", "240", "--out", str(check)], 260),
        ("mfu-large", [python, "-m", "dlx", *LARGE_BATCHES, "--out", str(work / "mfu-large")], 120),
        ("prepare", [python, "-c", prepare], 30),
        ("docmask-on", [*docmask, "--document-mask"], 50),
        ("docmask-off", docmask, 40),
        ("pretrain", [*demo, "--train.max_steps", "40"], 45),
        ("resume", [python, "-m", "dlx", "pretrain", "--run-dir", str(run), "--resume", "--train.max_steps", "60"], 35),
        ("generate", [python, "-m", "dlx", "generate", str(run), "--prompt", "def ", "--temperature", "0"], 20),
    ]


def write_docmask_model(work: Path) -> None:
    """llama3.2-1b's shape with the demo dataset's 8,192-token vocabulary (the attention is what is compared)."""
    from dlx.model.presets import resolve_model_args

    args = resolve_model_args("llama3.2-1b").model_dump(mode="json")
    (work / "llama3.2-1b-vocab8k.json").write_text(json.dumps({**args, "vocab_size": 8192}))


def figure(name: str, work: Path) -> str:
    """The step's headline number, read from what it wrote."""
    from dlx.bench.results import read_rows

    if name == "mfu-large":
        rows = [r for r in read_rows(work / "mfu-large" / "bench.csv") if r["status"] == "ok"]
        best = max(rows, key=lambda r: r["mfu"])
        return f"best MFU {best['mfu']:.1%} at micro-batch {best['micro_batch']}, grad accum {best['grad_accum']}"
    if name.startswith("docmask"):
        rows = [r for r in read_rows(work / "docmask" / "bench.csv") if r["status"] == "ok"]
        return "; ".join(f"mask {r['document_mask']}: {r['tokens_per_s']:,.0f} tokens/s" for r in rows)
    if name in ("pretrain", "resume"):
        records = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
        last = records[-1]
        return f"step {last['step']}, loss {last['loss']:.3f}, {last.get('tokens_per_s', 0):,.0f} tokens/s"
    return ""


def collect(work: Path, out: Path) -> None:
    """At most 8 files into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for source, name in (
        (work / "check" / "entry.md", "entry.md"),
        (work / "check" / "run.log", "check.log"),
        (work / "docmask" / "bench.md", "docmask.md"),
        (work / "mfu-large" / "bench.md", "mfu-large.md"),
        (work / "steps.log", "steps.log"),
        (work / "summary.txt", "summary.txt"),
    ):
        if source.is_file():
            shutil.copy(source, out / name)
    run = work / "run"
    if run.is_dir():
        with tarfile.open(out / "run.tar.gz", "w:gz") as tar:
            for path in sorted(run.rglob("*")):
                if path.is_file() and path.suffix not in (".safetensors", ".pt", ".distcp"):
                    tar.add(path, arcname=str(path.relative_to(run.parent)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the steps and run nothing")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "runs/first-contact")))
    parser.add_argument("--only", help="comma-separated step names to run (a rerun of those that failed)")
    args = parser.parse_args()
    if args.dry_run:
        for name, argv, seconds in steps(Path(tempfile.gettempdir()) / "dlx-first-contact-WORK"):
            print(f"{name} (≤ {seconds:.0f} s): {shlex.join(argv)}")
        return 0
    names = [name for name, _, _ in steps(Path("WORK"))]
    chosen = [name for name in names if not args.only or name in args.only.split(",")]
    if not chosen:
        return run_gpu_bench.fail(f"--only names no step; choose from {', '.join(names)}")
    with tempfile.TemporaryDirectory(prefix="dlx-first-contact-") as tmp:
        return run_steps(Path(tmp), chosen, args.out)


def run_steps(work: Path, chosen: list[str], out: Path) -> int:
    """Run the steps named in `chosen` in `work`, then bring the files back into `out`."""
    deps = work / "deps"
    offline_deps.unpack_missing(offline_deps.WHEELS, deps)  # once; the check then finds them present
    env = run_gpu_bench.child_env(deps)
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]
    sys.path.insert(0, str(deps))
    write_docmask_model(work)
    summary = []
    with open(work / "steps.log", "w") as log:
        for name, argv, seconds in steps(work):
            if name not in chosen:
                continue
            start = time.monotonic()
            status = run_gpu_bench.run_within(argv, env, seconds, log)
            try:
                found = figure(name, work) if status == "ok" else ""
            except (OSError, KeyError, ValueError) as error:
                found = f"no figure ({error})"
            summary.append(f"{name}: {status} in {time.monotonic() - start:.0f} s. {found}".rstrip())
            print(summary[-1], flush=True)
    (work / "summary.txt").write_text("\n".join(summary) + "\n")
    collect(work, out)
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
