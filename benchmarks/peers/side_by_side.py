"""dlx and torchtitan side by side at one setting, in this process: the first losses checked equal from the same
initial weights before any timing, then each contender's warm-up and timed steps, one after the other, with its
memory. `python benchmarks/peers/side_by_side.py SETTING --contenders dlx,torchtitan --out OUT.json` writes OUT.

SETTING is one of SETTINGS. On CUDA the memory is the allocator's peak (`max_memory_allocated`, reset between the
contenders); on the CPU it is the process's resident-set high-water mark and its growth over the mark before the
contender was built, so bench_titan.py runs each contender in a process of its own. The dlx contender is a real
`dlx pretrain` run's `train_loop` (peers/contenders.py's `Dlx`); torchtitan's is `Trainer.train_step`
(peers/titan.py's `Titan`). tokens/s: tokens of the timed steps over their synchronised wall time.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2] / "src")]
from peers.titan import TITAN, Setting  # noqa: E402

SCALED_1B = ("--model.preset", "llama3.2-1b", "--model.dim", "512", "--model.n_layers", "4", "--model.n_heads", "8")
SCALED_1B += ("--model.n_kv_heads", "2", "--model.vocab_size", "16384")
SETTINGS = {
    "demo": Setting(("--model.preset", "demo"), 256, 8, "fp32", False),
    "1b-scaled": Setting(SCALED_1B, 256, 8, "fp32", False),
    "demo-bf16": Setting(("--model.preset", "demo"), 256, 8, "bf16", False),
    "1b-scaled-bf16": Setting(SCALED_1B, 256, 8, "bf16", False),
    "llama3.2-1b": Setting(("--model.preset", "llama3.2-1b"), 2048, 24, "bf16", True),
    "dry": Setting(("--model.preset", "debug"), 32, 2, "bf16", False),
}
"""demo: the embedded demo preset; 1b-scaled: llama3.2-1b's ratios at dim 512, 4 layers, 8/2 heads, a 16,384
vocabulary (bench_memory_estimate's shape); both in fp32 and (`-bf16`) in bf16; llama3.2-1b: dlx's best measured GPU
shape at grad accum 1 (seq 2048, micro-batch 24, compiled: 57.3 % MFU on the H200; 57.6 % at grad accum 4, for 4× the
step time); dry: the debug model on the CPU in bf16, next_contact.py's dry run."""
CONTENDERS = ("dlx", TITAN)
LOSS_TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2}
"""Most the first losses may differ: fp32 sums in another order (absolute); bf16 compute, where torchtitan casts every
weight (FSDP2's MixedPrecisionPolicy) and dlx's autocast keeps norms in fp32 (relative)."""
CHECK_ROWS = 2
"""Rows of the first batch the loss check runs on (the logits of 24 × 2048 × 128,256 in fp32 would take 25 GB)."""


def dlx_first_loss(setting: Setting, device: torch.device) -> float:
    """dlx's initial model (from train.seed) on the first rows of the stream's first batch, in the setting's
    precision."""
    from dlx.device import autocast
    from peers.titan import dlx_initial_model, synthetic_loader

    model = dlx_initial_model(setting, device)
    inputs, targets = next(synthetic_loader(setting, model.args.vocab_size))[:2]
    with torch.no_grad(), autocast(device, setting.precision):
        loss = model(inputs[:CHECK_ROWS].to(device), targets=targets[:CHECK_ROWS].to(device)).loss.item()
    del model
    return loss


def losses_agree(setting: Setting, dlx: float, titan: float) -> bool:
    gap = abs(dlx - titan) if setting.precision == "fp32" else abs(dlx / titan - 1)
    return gap <= LOSS_TOLERANCE[setting.precision]


def build(kind: str, setting: Setting, work: Path, device: torch.device):
    from peers.contenders import Dlx
    from peers.titan import Titan

    if kind == TITAN:
        return Titan(setting, work / "titan")
    return Dlx(setting.precision, work / "dlx", argv=setting.dlx_argv(), device=device)


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: KiB


def measure(
    kind: str,
    setting: Setting,
    work: Path,
    device: torch.device,
    steps: int,
    warmup: int,
    dlx_loss: float | None,
    profile_top: int = 0,
) -> dict:
    """Build one contender, check its first loss against `dlx_loss` where it is torchtitan's, then run warm-up and
    timed steps (`profile_top`: under torch.profiler, the busiest operators' self seconds in `ops`)."""
    rss_before = peak_rss_gb()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    contender = build(kind, setting, work, device)
    result: dict = {"build_s": time.perf_counter() - start}
    try:
        if kind == TITAN:
            result["first_loss"] = loss = contender.first_loss(CHECK_ROWS)
            result["stood_in"] = contender.stood_in
            if not losses_agree(setting, dlx_loss, loss):
                raise SystemExit(
                    f"error: first losses differ: dlx {dlx_loss:.6f}, torchtitan {loss:.6f} (tolerance "
                    f"{LOSS_TOLERANCE[setting.precision]:g}): the two do not start from the same model"
                )
        result["warmup_s"] = contender.run(warmup)
        if profile_top:
            seconds, result["ops"] = profiled(lambda: contender.run(steps), profile_top)
        else:
            seconds = contender.run(steps)
    finally:
        contender.close()
    result |= {"timed_s": seconds, "tokens_per_s": steps * setting.seq_len * setting.micro_batch / seconds}
    result |= {"rss_peak_gb": peak_rss_gb(), "rss_growth_gb": peak_rss_gb() - rss_before}
    if device.type == "cuda":
        result["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    return result


def profiled(run, top: int) -> tuple[float, dict[str, float]]:
    """`run()`'s seconds under torch.profiler (CPU and, where there is one, CUDA), and the `top` operators by self
    time, in seconds over the run (self CPU time; on CUDA the device's)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        seconds = run()
    cuda = torch.cuda.is_available()
    per_op = {e.key: (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e6 for e in prof.key_averages()}
    return seconds, dict(sorted(per_op.items(), key=lambda item: -item[1])[:top])


def side_by_side(setting: Setting, kinds: list[str], steps: int, warmup: int, profile_top: int = 0) -> dict:
    """The loss check (where torchtitan runs), then each contender measured in turn."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out: dict = {"setting": setting.__dict__, "device": device.type, "contenders": {}}
    if TITAN in kinds:
        out["dlx_first_loss"] = dlx_first_loss(setting, device)
    with tempfile.TemporaryDirectory(prefix="dlx-side-by-side-") as tmp:
        for kind in kinds:
            dlx_loss = out.get("dlx_first_loss")
            out["contenders"][kind] = measure(kind, setting, Path(tmp), device, steps, warmup, dlx_loss, profile_top)
    figures = out["contenders"]
    if len(figures) == 2:
        out["dlx_over_titan"] = figures["dlx"]["tokens_per_s"] / figures[TITAN]["tokens_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("setting", choices=sorted(SETTINGS))
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated, run in this order")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per contender")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per contender first (compilation)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file written")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="turn torchtitan's CUDA graphs off")
    parser.add_argument("--profile", type=int, default=0, help="the busiest N operators of the timed steps")
    args = parser.parse_args(argv)
    kinds = [kind.strip() for kind in args.contenders.split(",")]
    if not set(kinds) <= set(CONTENDERS):
        parser.error(f"--contenders: choose from {', '.join(CONTENDERS)}")
    if TITAN in kinds and importlib.util.find_spec(TITAN) is None:
        raise SystemExit(
            "error: torchtitan is not installed: pip install 'dlx[bench]' (a device machine: the wheels "
            "of benchmarks/gpu/offline_deps.py download)"
        )
    setting = dataclasses.replace(SETTINGS[args.setting], cuda_graphs=not args.no_cuda_graphs)
    result = side_by_side(setting, kinds, args.steps, args.warmup, args.profile)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
