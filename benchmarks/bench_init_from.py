"""Loading Llama-3.2-1B-shaped Hugging Face weights: dlx's `model.init_from` against transformers' `from_pretrained`.

The folder: a LlamaForCausalLM with llama3.2-1b's config (1,235,814,400 parameters, tied embeddings, 128,256-token
vocabulary), random weights in bf16 written by transformers' `save_pretrained` (one 2.47 GB model.safetensors, as
the published model ships), deleted at the end. Nothing is downloaded.

Contenders, each load in a fresh subprocess, the contenders alternating within each round (the page cache is warm for
all: the file was just written and is read once before the first round):
  dlx init_from fp32      what `dlx pretrain --model.init_from FOLDER` does before training: `build_model` (meta
                          device, uninitialised fp32 storage, tensors converted from 64 MB chunks of the mapped file,
                          RoPE tables for max_seq_len 2048, the training context of recipes/llama3.2-1b.yaml; for
                          config.json's 131,072 positions they would take 67 MB and about a second more here)
  hf from_pretrained fp32 AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32)
  dlx load_hf bf16        the same folder kept in its stored dtype (`dlx import-hf`, `dlx.model.hf.load_hf`): plain
                          reads straight into the parameters
  hf from_pretrained bf16 AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.bfloat16): the parameters are
                          views of the memory-mapped file, so this reads nothing yet (the pages come in on first
                          use); not the same work as dlx's bf16 row, which holds the weights in its own memory

Per load: seconds to a model ready for a forward pass, after a warm-up load of a tiny folder in the same process (so
that no first-use imports are timed); the process's resident set size before the load and its peak after (VmHWM in
/proc/self/status; ru_maxrss would carry the parent's size over fork and exec). "load peak" = peak − before: what the
load itself added, to compare with the weights' own bytes (parameters × bytes per element); the target is at most
weights + 10 %.

Run:  .venv/bin/python benchmarks/bench_init_from.py        (appends to BENCHMARKS.md; --no-record to only print)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTENDERS = ("dlx init_from fp32", "hf from_pretrained fp32", "dlx load_hf bf16", "hf from_pretrained bf16")
LLAMA32_1B = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": True,
}


def write_folder(folder: Path) -> int:
    """Random llama3.2-1b-shaped weights in bf16, saved by transformers; returns the parameter count."""
    import torch
    import transformers

    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA32_1B))
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def write_warmup_folder(folder: Path) -> None:
    """A tiny Llama folder of the same layout: each child loads it first, so that the timed load pays no first-use
    imports (both libraries import parts of themselves lazily)."""
    import torch
    import transformers

    config = {**LLAMA32_1B, "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    config.update(num_attention_heads=4, num_key_value_heads=2)
    torch.set_default_dtype(torch.bfloat16)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).save_pretrained(folder)
    torch.set_default_dtype(torch.float32)


def load(contender: str, folder: str):
    import torch

    if contender == "dlx init_from fp32":
        from dlx.train.build.model import build_model
        from dlx.train.recipe import load_recipe
        from dlx.train.rundir.trained import resolve_trained

        options = ["--model.init_from", folder, "--model.max_seq_len", "2048", "--train.max_steps", "1"]
        config = load_recipe(None, [*options, "--data.seq_len", "64"])
        return build_model(config, torch.device("cpu"), resolve_trained(folder, "model.init_from"))
    if contender == "dlx load_hf bf16":
        from dlx.model.hf import load_hf

        return load_hf(folder)
    import transformers

    dtype = torch.float32 if contender.endswith("fp32") else torch.bfloat16
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)


def load_once(contender: str, folder: str, warmup: str) -> dict:
    """One load in this process (run as a subprocess), after a warm-up load: seconds, RSS before, peak RSS."""
    import psutil

    del_me = load(contender, warmup)
    del del_me
    before = psutil.Process().memory_info().rss
    start = time.perf_counter()
    model = load(contender, folder)
    seconds = time.perf_counter() - start
    peak = peak_rss()
    first = next(model.parameters())
    weights = sum(p.numel() for p in model.parameters()) * first.element_size()
    return {"seconds": seconds, "before": before, "peak": peak, "weights": weights, "dtype": str(first.dtype)}


def peak_rss() -> int:
    """This process's peak resident set size in bytes, since its exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def write_in_subprocess(folder: Path, warmup: Path) -> int:
    """Both folders, written by a child process, so that this one stays small; returns the parameter count."""
    command = [sys.executable, __file__, "--write", str(folder), str(warmup)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"writing the folders failed:\n{result.stderr[-3000:]}")
    return int(result.stdout.strip().splitlines()[-1])


def measure(contender: str, folder: Path, warmup: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, __file__, "--child", contender, str(folder), str(warmup)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"{contender} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def warm_page_cache(folder: Path) -> None:
    for file in folder.glob("*.safetensors"):
        with open(file, "rb") as f:
            while f.read(1 << 24):
                pass


def table(results: dict[str, list[dict]]) -> list[str]:
    gb = 1e9
    rows = [
        "| contender | dtype | seconds, median (min–max) | RSS before GB | peak RSS GB | load peak GB | weights GB "
        "| load peak ÷ weights |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        seconds = [r["seconds"] for r in runs]
        added = statistics.median((r["peak"] - r["before"]) for r in runs)
        weights = runs[0]["weights"]
        rows.append(
            f"| {name} | {runs[0]['dtype'].removeprefix('torch.')} | {statistics.median(seconds):.2f} "
            f"({min(seconds):.2f}–{max(seconds):.2f}) | {statistics.median(r['before'] for r in runs) / gb:.2f} "
            f"| {statistics.median(r['peak'] for r in runs) / gb:.2f} | {added / gb:.2f} | {weights / gb:.2f} "
            f"| {added / weights:.3f} |"
        )
    return rows


def ratio_lines(results: dict[str, list[dict]]) -> list[str]:
    lines = []
    for dtype in ("fp32", "bf16"):
        dlx = next(v for k, v in results.items() if k.startswith("dlx") and k.endswith(dtype))
        hf = results[f"hf from_pretrained {dtype}"]
        per_round = [d["seconds"] / h["seconds"] for d, h in zip(dlx, hf, strict=True)]
        lines.append(
            f"- {dtype}: dlx time ÷ transformers time, per round: {', '.join(f'{r:.2f}' for r in per_round)} "
            f"(median {statistics.median(per_round):.2f}; below 1 is faster)"
        )
    return lines


def environment() -> list[str]:
    import torch
    import transformers

    from peers.record import cpu_name, machine_load

    git = ["git", "-C", str(ROOT)]
    sha = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = cpu_name()
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return [
        f"- command: `{shlex.join([os.path.relpath(sys.executable, ROOT), *sys.argv])}` (from the repository root)",
        f"- git: {sha}; python {platform.python_version()}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}",
        f"- hardware: {cpu}, {os.cpu_count()} logical CPUs, {memory_gib:.0f} GiB; {machine_load()}",
    ]


def record(lines: list[str]) -> None:
    """Append at the end of BENCHMARKS.md, under the section's heading (added once)."""
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text()
    heading = "## Loading Hugging Face weights (model.init_from)"
    if heading not in text:
        text = text.rstrip("\n") + f"\n\n{heading}\n\nMeasured by `benchmarks/bench_init_from.py`; see its docstring.\n"
    path.write_text(text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each loads once per contender")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    parser.add_argument("--child", nargs=3, metavar=("CONTENDER", "FOLDER", "WARMUP"), help=argparse.SUPPRESS)
    parser.add_argument("--write", nargs=2, metavar=("FOLDER", "WARMUP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(load_once(*args.child)))
        return
    if args.write:
        write_warmup_folder(Path(args.write[1]))
        print(write_folder(Path(args.write[0])))
        return
    header = environment()
    tmp = Path(tempfile.mkdtemp(prefix="dlx-bench-init-from-"))
    try:
        parameters = write_in_subprocess(tmp / "llama3.2-1b", tmp / "warmup")
        size = sum(f.stat().st_size for f in (tmp / "llama3.2-1b").iterdir())
        warm_page_cache(tmp / "llama3.2-1b")
        results: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
        for round_index in range(args.rounds):
            order = CONTENDERS if round_index % 2 == 0 else tuple(reversed(CONTENDERS))
            for name in order:
                results[name].append(measure(name, tmp / "llama3.2-1b", tmp / "warmup"))
                print(f"round {round_index + 1}: {name}: {results[name][-1]['seconds']:.2f} s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"### {stamp}",
        "",
        *header,
        f"- folder: {parameters:,} parameters, bf16, {size / 1e9:.2f} GB on disk (written by transformers, page "
        f"cache warm); {args.rounds} rounds, contenders alternating, each load in its own process",
        "",
        *table(results),
        "",
        *ratio_lines(results),
    ]
    print("\n".join(lines))
    if not args.no_record:
        record(lines)


if __name__ == "__main__":
    main()
