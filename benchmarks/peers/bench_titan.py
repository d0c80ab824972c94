"""Peers: dlx against torchtitan on the CPU, the same model, data, optimizer and precision, side by side.

At each setting (the demo preset, and llama3.2-1b's shape scaled to dim 512 and 4 layers; side_by_side.py's SETTINGS)
every round runs each contender in a fresh process of its own (side_by_side.py, `--contenders` one of them), the order
rotating round by round; torchtitan's process first checks that its first loss equals dlx's from the same initial
weights. The ratio dlx ÷ torchtitan is taken within a round; memory is each process's resident-set high-water mark
and its growth while the contender was built and trained. The installation each needs is the size of the wheels of
the distributions it imports beyond torch (peers/installs.py).

Run:  .venv/bin/python benchmarks/peers/bench_titan.py   (appends to BENCHMARKS.md, "Peers"; --no-record: print only)
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from peers.record import PEERS_SECTION, ROOT, environment, publish  # noqa: E402
from peers.titan import TITAN  # noqa: E402

WATCHED = ["src/dlx/train", "src/dlx/model", "benchmarks/peers"]
CONTENDERS = ("dlx", TITAN)


def one_process(setting: str, kind: str, steps: int, warmup: int, out: Path, profile: int = 0) -> dict:
    """side_by_side.py for one contender in a fresh process; its JSON."""
    argv = [sys.executable, str(HERE / "side_by_side.py"), setting, "--contenders", kind]
    argv += ["--steps", str(steps), "--warmup", str(warmup), "--out", str(out), "--profile", str(profile)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {kind} at {setting} failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.read_text())


def rounds(setting: str, n_rounds: int, steps: int, warmup: int, tmp: Path) -> list[dict[str, dict]]:
    """Per round, each contender's JSON; the order rotates."""
    results = []
    for index in range(n_rounds):
        order = CONTENDERS[index % 2 :] + CONTENDERS[: index % 2]
        round_figures = {}
        for kind in order:
            result = one_process(setting, kind, steps, warmup, tmp / f"{setting}-{kind}-{index}.json")
            round_figures[kind] = result["contenders"][kind] | {"dlx_first_loss": result.get("dlx_first_loss")}
        print(
            f"{setting} round {index + 1}/{n_rounds}: "
            + ", ".join(f"{k} {v['tokens_per_s']:,.0f} tokens/s" for k, v in round_figures.items()),
            file=sys.stderr,
        )
        results.append(round_figures)
    return results


def spread(values: list[float], form: str) -> str:
    return f"{statistics.median(values):{form}} ({min(values):{form}}, {max(values):{form}})"


def setting_rows(name: str, results: list[dict[str, dict]]) -> list[str]:
    """One row per contender, then the ratio, for one setting."""
    rows = []
    for kind in CONTENDERS:
        figures = [r[kind] for r in results]
        speed = spread([f["tokens_per_s"] for f in figures], ",.0f")
        peak = statistics.median(f["rss_peak_gb"] for f in figures)
        growth = statistics.median(f["rss_growth_gb"] for f in figures)
        rows.append(f"| {name} | {kind} | {speed} | {peak:.2f} | {growth:.2f} |")
    ratios = [r["dlx"]["tokens_per_s"] / r[TITAN]["tokens_per_s"] for r in results]
    rows.append(f"| {name} | **dlx ÷ torchtitan** | {spread(ratios, '.3f')} | | |")
    return rows


def loss_lines(all_results: dict[str, list[dict[str, dict]]]) -> list[str]:
    lines = []
    for name, results in all_results.items():
        titan = results[0][TITAN]
        lines.append(
            f"- {name}: first loss dlx {titan['dlx_first_loss']:.6f}, torchtitan {titan['first_loss']:.6f} "
            f"(same initial weights, first 2 rows of the first batch; checked before any timing in every round)"
        )
    stood_in = results[0][TITAN].get("stood_in") or []
    if stood_in:
        lines.append(f"- what the harness stood in for or patched to run torchtitan here: {'; '.join(stood_in)}")
    return lines


def op_tables(settings: list[str], steps: int, warmup: int, top: int, tmp: Path) -> list[str]:
    """One more process per contender and setting, its timed steps under torch.profiler: the busiest operators of
    either side by side (self CPU seconds per step)."""
    lines = []
    for setting in settings:
        ops = {kind: one_process(setting, kind, steps, warmup, tmp / f"ops-{setting}-{kind}.json", top)
               for kind in CONTENDERS}  # fmt: skip
        per = {kind: result["contenders"][kind]["ops"] for kind, result in ops.items()}
        names = sorted(
            set(per["dlx"]) | set(per[TITAN]), key=lambda n: -max(per["dlx"].get(n, 0), per[TITAN].get(n, 0))
        )
        lines += ["", f"{setting}, profiled ({steps} steps each, self CPU seconds per step):", ""]
        lines += ["| operator | dlx | torchtitan |", "|---|---|---|"]
        for name in names[:top]:
            dlx_s, titan_s = (per[k].get(name) for k in ("dlx", TITAN))
            shown = ["" if v is None else f"{v / steps:.3f}" for v in (dlx_s, titan_s)]
            lines.append(f"| `{name}` | {shown[0]} | {shown[1]} |")
        totals = [sum(per[k].values()) / steps for k in ("dlx", TITAN)]
        lines.append(f"| (these operators, all listed per side) | {totals[0]:.3f} | {totals[1]:.3f} |")
    return lines


def main() -> None:
    from peers.installs import install_lines
    from peers.side_by_side import SETTINGS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="demo,1b-scaled", help="comma-separated side_by_side.py SETTINGS")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (a fresh process per contender each)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per contender per round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    parser.add_argument("--profile", type=int, default=0, help="then op tables: the busiest N operators per setting")
    args = parser.parse_args()
    header = environment(WATCHED)
    with tempfile.TemporaryDirectory(prefix="dlx-bench-titan-") as tmp:
        results = {
            name: rounds(name, args.rounds, args.steps, args.warmup, Path(tmp)) for name in args.settings.split(",")
        }
        settings = args.settings.split(",")
        tables = op_tables(settings, args.steps, args.warmup, args.profile, Path(tmp)) if args.profile else []
    table = ["| setting | contender | tokens/s, median (min, max) | peak RSS GB | RSS growth GB |"]
    table.append("|---|---|---|---|---|")
    for name, setting_results in results.items():
        table += setting_rows(name, setting_results)
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} — dlx against torchtitan, CPU",
        "",
        *header,
        "",
        "demo: dim 256, 4 layers, 4/2 heads, vocab 8192; 1b-scaled: llama3.2-1b at dim 512, 4 layers, 8/2 heads, vocab "
        "16,384, tied; both seq 256, micro-batch 8, fused AdamW lr 3e-4 (betas 0.9/0.95, weight decay 0.1), clip 1.0, "
        "no compile, dlx's synthetic tokens, SDPA causal attention in both; precision "
        + ", ".join(f"{name} {SETTINGS[name].precision}" for name in results)
        + " (bf16: dlx's autocast over fp32 weights, torchtitan's FSDP2 MixedPrecisionPolicy over fp32 master "
        "weights); "
        f"{args.rounds} rounds, each contender in a fresh process per round, {args.warmup} warm-up + {args.steps} "
        "timed steps:",
        "",
        *table,
        "",
        *loss_lines(results),
        *tables,
        "",
        *install_lines(),
    ]
    publish(*PEERS_SECTION, lines, record=not args.no_record)


if __name__ == "__main__":
    main()
