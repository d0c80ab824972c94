"""write_report: report.md with both conventions and the verdict, and three PNGs; end to end from the meter."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from dlx.metrics.logger import MetricsLogger, read_jsonl
from dlx.metrics.meter import ThroughputMeter
from dlx.metrics.peak import Peak
from dlx.metrics.report import write_report
from dlx.metrics.timing import PhaseTimer
from dlx.metrics.verdict import bottleneck_verdict
from dlx.model.args import ModelArgs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_run(run_dir: Path, n_steps: int = 8) -> ThroughputMeter:
    """Feed the meter the way the trainer does, with sleeps for work, and log every step."""
    args = ModelArgs(dim=64, n_layers=2, n_heads=4, vocab_size=256, multiple_of=16, max_seq_len=32)
    meter = ThroughputMeter(args, 32, torch.device("cpu"), "fp32", peak=Peak(0.01, "fake peak"))
    timer = PhaseTimer(torch.device("cpu"))
    with MetricsLogger(run_dir) as logger:
        for step in range(1, n_steps + 1):
            for phase in ("data_wait", "forward", "backward", "optimizer"):
                with timer.phase(phase):
                    pass
            timer.end_step()
            timings = timer.window()
            timings["step_s"] = max(timings["step_s"], 1e-3)
            loss = 5.0 * math.exp(-step / 4)
            logger.log(meter.record(step=step, loss=loss, lr=1e-3, grad_norm=1.0, tokens=256, timings=timings))
            if step % 4 == 0:
                logger.log_eval({"step": step, "loss": loss + 0.1, "perplexity": math.exp(loss + 0.1)})
    return meter


def test_report_from_logged_run(tmp_path: Path) -> None:
    meter = fake_run(tmp_path)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    verdict = bottleneck_verdict(records)
    path = write_report(tmp_path, records, verdict, meter.header(), read_jsonl(tmp_path / "eval.jsonl"))
    assert path == tmp_path / "report.md"
    for name in ("loss.png", "throughput.png", "phases.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
    text = path.read_text()
    for needle in (
        "6·N + 12·L·H·Q·T",
        "6·N",
        "Attention convention",
        "Dense convention",
        "fake peak",
        verdict.kind,
        verdict.suggestion,
        "| train (nats/token) | 3.8940 (step 1) | 0.6767 (step 8) | 0.6767 (step 8) | ",
        "| validation (nats/token) | 1.9394 (step 4) | 0.7767 (step 8) | 0.7767 (step 8) | |",
        "Validation perplexity at step 8: 2.17 (e^loss)",
        "Confidence: ",
        "MFU, dense convention",
        "![loss](loss.png)",
    ):
        assert needle in text, needle
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporaries
    losses = [5.0 * math.exp(-step / 4) for step in range(1, 9)]
    ema = sum(0.6 ** (8 - i) * 0.4 * x for i, x in enumerate(losses, start=1)) / (1 - 0.6**8)  # debiased EMA, by hand
    assert f"| 0.6767 (step 8) | {ema:.4f} |" in text


def test_report_without_peak_or_eval(tmp_path: Path) -> None:
    records = [
        {
            "step": s,
            "loss": 3.0,
            "tokens_per_s": 100.0,
            "tflops": 0.1,
            "tflops_dense": 0.09,
            "mfu": None,
            "mfu_dense": None,
            "forward_s": 0.5,
            "backward_s": 0.4,
            "other_s": 0.1,
            "step_s": 1.0,
            "peak_mem_gb": 0.5,
        }
        for s in range(1, 4)
    ]
    path = write_report(tmp_path, records, bottleneck_verdict(records), ["MFU omitted: unknown device"])
    text = path.read_text()
    assert "| validation | not evaluated (eval.every 0) |" in text and "| MFU, attention convention | n/a |" in text
    assert (tmp_path / "throughput.png").read_bytes()[:8] == PNG_MAGIC


def test_report_with_tasks_and_bits_per_byte(tmp_path: Path) -> None:
    """tasks.jsonl (eval.tasks) becomes a table of each metric ± stderr, first and last evaluation, and tasks.png;
    validation bits per byte is stated first → last."""
    records = [{"step": s, "loss": 3.0, "tokens_per_s": 100.0, "step_s": 1.0, "forward_s": 1.0} for s in (1, 2)]
    evals = [{"step": 1, "loss": 3.0, "bpb": 1.5}, {"step": 2, "loss": 2.5, "bpb": 1.25}]
    with MetricsLogger(tmp_path) as logger:
        for step, acc in ((1, 0.25), (2, 0.5)):
            logger.log_tasks({"step": step, "t/acc": acc, "t/acc_stderr": 0.1, "tasks_s": 0.5})
    text = write_report(tmp_path, records, bottleneck_verdict(records), [], evals).read_text()
    assert "| t/acc | 0.2500 ± 0.1000 | 0.5000 ± 0.1000 |" in text
    assert "Validation bits per byte: 1.5000 (step 1) → 1.2500 (step 2)" in text
    assert (tmp_path / "tasks.png").read_bytes()[:8] == PNG_MAGIC and "![downstream tasks](tasks.png)" in text


def test_report_lists_events_and_names_a_straggler(tmp_path: Path) -> None:
    record = {"step": 1, "loss": 3.0, "tokens_per_s": 100.0, "forward_s": 0.5, "backward_s": 0.4, "step_s": 1.0}
    record |= {"rank_step_s_max": 1.0, "rank_step_s_min": 0.5, "rank_step_s_median": 0.75, "slowest_rank": 1}
    records = [{**record, "step": s} for s in range(1, 4)]
    events = [
        {"event": "loss_spike", "step": 2, "loss": 30.0, "action": "skip"},
        {"event": "rollback", "step": 3, "to_step": 1, "skipped_steps": [2, 3]},
    ]
    text = write_report(tmp_path, records, bottleneck_verdict(records), [], events=events).read_text()
    assert "## Events" in text
    assert "| 2 | loss_spike | loss 30.0, action skip |" in text
    assert "| 3 | rollback | to_step 1, skipped_steps [2, 3] |" in text
    assert "- Straggler: rank 1 takes 1.33x the median rank's step time" in text
