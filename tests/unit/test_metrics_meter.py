"""ThroughputMeter arithmetic against hand-computed values."""

from __future__ import annotations

import json

import pytest
import torch

from dlx.metrics.meter import ThroughputMeter
from dlx.metrics.peak import Peak
from dlx.metrics.records import phase_seconds
from dlx.model.args import ModelArgs

# A tiny config (the demo preset's shape). By hand: head_dim 64, FFN int(2·4·256/3) = 682 → multiple of 16 → 688.
# Attention weights per layer: 256·4·64·2 (q, o) + 256·2·64·2 (k, v) = 196,608; FFN: 3·256·688 = 528,384.
# N = 4·(196,608 + 528,384) + 256·8192 (output projection) = 2,899,968 + 2,097,152 = 4,997,120.
ARGS = ModelArgs(dim=256, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=8192, multiple_of=16, max_seq_len=256)
DENSE = 6 * 4_997_120  # 29,982,720 FLOPs per token
ATTENTION = DENSE + 12 * 4 * 4 * 64 * 256  # + 3,145,728 = 33,128,448
TIMINGS = {"data_wait": 0.05, "forward": 0.1, "backward": 0.2, "optimizer": 0.05, "communication": 0.0, "step_s": 0.5}


def make_meter(peak: Peak, world_size: int = 2) -> ThroughputMeter:
    return ThroughputMeter(ARGS, 256, torch.device("cpu"), "fp32", world_size=world_size, peak=peak)


def test_record_arithmetic_is_exact() -> None:
    meter = make_meter(Peak(0.5, "fake peak"))
    rec = meter.record(step=7, loss=torch.tensor(2.5), lr=3e-4, grad_norm=1.0, tokens=4096, timings=TIMINGS)
    assert meter.flops.dense == DENSE and meter.flops.attention == ATTENTION
    assert rec["tokens_per_s"] == 4096 / 0.5 == 8192
    assert rec["tflops"] == pytest.approx(4096 * ATTENTION / 1e12, rel=1e-12)  # per device: 8192 / 2
    assert rec["tflops_dense"] == pytest.approx(4096 * DENSE / 1e12, rel=1e-12)
    assert rec["mfu"] == pytest.approx(4096 * ATTENTION / 1e12 / 0.5, rel=1e-12)
    assert rec["mfu_dense"] == pytest.approx(4096 * DENSE / 1e12 / 0.5, rel=1e-12)
    assert rec["data_wait_pct"] == pytest.approx(10.0)
    assert rec["other_s"] == pytest.approx(0.1)
    assert (rec["step"], rec["loss"], rec["forward_s"], rec["step_s"]) == (7, 2.5, 0.1, 0.5)
    assert rec["peak_mem_gb"] > 0
    assert "warning" not in rec
    json.dumps(rec, allow_nan=False)


def test_no_peak_means_mfu_none_and_header_says_why() -> None:
    meter = make_meter(Peak(None, "'Mystery GPU' is not in dlx's peak table; MFU omitted"))
    rec = meter.record(step=1, loss=1.0, lr=1e-3, grad_norm=None, tokens=1024, timings=TIMINGS)
    assert rec["mfu"] is None and rec["mfu_dense"] is None and rec["tflops"] > 0
    assert any("Mystery GPU" in line for line in meter.header())
    assert "MFU n/a" in meter.format_line(rec)


def test_mfu_above_one_is_reported_not_clipped() -> None:
    meter = make_meter(Peak(1e-6, "absurdly low peak"))
    rec = meter.record(step=1, loss=1.0, lr=1e-3, grad_norm=1.0, tokens=4096, timings=TIMINGS)
    assert rec["mfu"] > 1.0 and "exceeds 100%" in rec["warning"]
    assert meter.first_warning == rec["warning"]


def test_header_fills_in_both_formulas() -> None:
    header = "\n".join(make_meter(Peak(0.5, "fake peak")).header())
    assert "6·N + 12·L·H·Q·T = 6·4,997,120 + 12·4·4·64·256" in header
    assert "6·N = 6·4,997,120" in header
    assert "0.5 TFLOPS (fp32; fake peak)" in header
    assert "ru_maxrss" in header
    assert "2 device(s)" in header


def test_format_line_and_extra_phases() -> None:
    meter = make_meter(Peak(0.5, "fake peak"))
    rec = meter.record(step=3, loss=2.0, lr=1e-3, grad_norm=0.5, tokens=4096, timings={**TIMINGS, "eval_fwd": 0.01})
    assert list(phase_seconds(rec)) == ["data_wait", "forward", "backward", "optimizer", "communication", "eval_fwd"]
    line = meter.format_line(rec)
    for part in ("step 3", "8,192 tok/s", "TFLOPS", "MFU", "data 50", "fwd 100", "bwd 200", "opt 50", "eval_fwd 10"):
        assert part in line


def test_bad_step_s_and_world_size() -> None:
    with pytest.raises(ValueError, match="world_size"):
        make_meter(Peak(0.5, "x"), world_size=0)
    with pytest.raises(ValueError, match="step_s"):
        make_meter(Peak(0.5, "x")).record(step=1, loss=1, lr=1, grad_norm=1, tokens=1, timings={"step_s": 0.0})
