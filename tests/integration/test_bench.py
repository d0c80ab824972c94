"""`dlx bench` on the `debug` preset: the CSV, table and plot, re-runs, OOM marking on CPU (by estimate) and on CUDA (by
catching torch.OutOfMemoryError), --find-max-batch, and bad input as one line with exit status 2."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dlx.bench import sweep
from dlx.bench.measure import measure_point
from dlx.bench.points import BenchPoint, BenchSetup, expand_points, parse_positive_ints
from dlx.bench.sweep import MemoryBudget, largest_fitting, run_sweep
from dlx.errors import UserError
from dlx.metrics.estimate import TrainingShape, max_micro_batch
from dlx.model import resolve_model_args
from train_helpers import single_torch_thread

README_COLUMNS = [
    "seq_len",
    "micro_batch",
    "grad_accum",
    "precision",
    "it_per_s",
    "tokens_per_s",
    "peak_mem_gb",
    "tflops",
    "mfu",
]

one_thread = pytest.fixture(autouse=True)(single_torch_thread)


def invoke(*args: str):
    """`dlx ARGS` in this process (no torch import per call); a UserError comes back as result.exception."""
    from typer.testing import CliRunner

    from dlx.cli.app import _register_commands, app

    if not app.registered_commands:  # another test may have registered them in this process
        _register_commands()
    return CliRunner().invoke(app, list(args))


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_sweep_writes_csv_table_plot_marks_oom_and_rerun_skips(tmp_path):
    # micro-batch 8192 needs ~2.0 GB at seq 16 and ~4.0 GB at seq 32 by the estimate: over the 1 GB budget, marked,
    # never run.
    argv = [
        "bench",
        "--model",
        "debug",
        "--seq-len",
        "16,32",
        "--micro-batch",
        "1,2,8192",
        "--precision",
        "fp32",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--memory-limit-gb",
        "1",
        "--out",
        str(tmp_path),
    ]
    first = invoke(*argv)
    assert first.exit_code == 0, first.output
    columns, rows = read_csv(tmp_path / "bench.csv")
    assert set(README_COLUMNS) <= set(columns)  # the columns README.md documents
    status = {(int(r["seq_len"]), int(r["micro_batch"])): r["status"] for r in rows}
    assert status == {
        (16, 1): "ok",
        (16, 2): "ok",
        (16, 8192): "oom_estimate",
        (32, 1): "ok",
        (32, 2): "ok",
        (32, 8192): "oom_estimate",
    }
    for row in rows:
        if row["status"] == "ok":
            assert float(row["it_per_s"]) > 0 and float(row["tokens_per_s"]) > 0 and float(row["peak_mem_gb"]) > 0
            assert float(row["tflops"]) > 0 and float(row["mfu"]) > 0 and float(row["est_mem_gb"]) > 0
            assert float(row["tokens_per_s"]) == pytest.approx(
                float(row["it_per_s"]) * int(row["seq_len"]) * int(row["micro_batch"])
            )
        else:
            assert row["it_per_s"] == "" and float(row["est_mem_gb"]) > 1.0
    assert "estimate" in first.output and "OOM (estimate" in first.output
    table = (tmp_path / "bench.md").read_text()
    assert "| fp32 | 32 | 8192 | 1 | OOM (est.) |" in table and "MFU (dense)" in table
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"

    before = (tmp_path / "bench.csv").read_text()
    second = invoke(*argv)
    assert second.exit_code == 0, second.output
    assert second.output.count("already (ok), skipped") == 4
    assert (tmp_path / "bench.csv").read_text() == before  # measured rows untouched, OOM rows re-evaluated alike


def test_cuda_out_of_memory_is_caught_and_larger_batches_are_not_tried(tmp_path, monkeypatch):
    """The CUDA path on a CPU: measure_point raises torch.OutOfMemoryError for micro-batch 2 at seq 16."""
    tried, released = [], []

    def measure(setup: BenchSetup, point: BenchPoint):
        tried.append((point.seq_len, point.micro_batch))
        if point.seq_len == 16 and point.micro_batch == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return measure_point(setup, point)

    monkeypatch.setattr(sweep.dev, "release_memory", lambda device: released.append(device))
    monkeypatch.setattr(sweep, "measure_point", measure)
    setup = BenchSetup("debug", torch.device("cpu"), steps=1, warmup=0)
    points = expand_points([16, 32], [1, 2, 4], [1], ["fp32"])
    budget = MemoryBudget(100.0, skip_by_estimate=False)
    rows = run_sweep(setup, points, tmp_path, budget, say=lambda line: None)
    by_point = {(r["seq_len"], r["micro_batch"]): r for r in rows}
    assert tried == [(16, 1), (16, 2), (32, 1), (32, 2), (32, 4)]  # (16, 4) never tried
    assert [by_point[16, b]["status"] for b in (1, 2, 4)] == ["ok", "oom", "oom"]
    assert by_point[16, 2]["note"] == "out of memory"
    assert by_point[16, 4]["note"] == "not tried: micro-batch 2 ran out"
    assert all(by_point[32, b]["status"] == "ok" for b in (1, 2, 4))
    assert len(released) == 1


def test_other_errors_are_not_taken_for_out_of_memory(tmp_path, monkeypatch):
    def measure(setup, point):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(sweep, "measure_point", measure)
    setup = BenchSetup("debug", torch.device("cpu"), steps=1, warmup=0)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_sweep(setup, expand_points([16], [1], [1], ["fp32"]), tmp_path, MemoryBudget(100.0, False), print)


def test_find_max_batch_on_cpu_comes_from_the_estimator(tmp_path):
    result = invoke(
        "bench",
        "--model",
        "debug",
        "--seq-len",
        "32,64",
        "--precision",
        "fp32,bf16",
        "--find-max-batch",
        "--memory-limit-gb",
        "0.5",
        "--out",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    assert "measured: not measured (CPU)" in result.output
    args = resolve_model_args("debug")
    for precision in ("fp32", "bf16"):
        for seq_len in (32, 64):
            shape = TrainingShape(seq_len, 1, precision=precision, device_type="cpu")  # the CPU's kernels
            expected = max_micro_batch(args, shape, 0.5)
            assert 0 < expected < 4096
            assert f"| {precision} | {seq_len} |  | {expected} |" in result.output
    assert (tmp_path / "max_batch.md").read_text() in result.output
    assert not (tmp_path / "bench.csv").exists()  # nothing was measured


def test_largest_fitting_against_a_known_monotone_predicate():
    for largest in (0, 1, 2, 3, 5, 7, 8, 100, 1000, 4095, 4096, 9999):
        calls = []

        def fits(n: int, largest: int = largest, calls: list[int] = calls) -> bool:
            calls.append(n)
            return n <= largest

        assert largest_fitting(fits, limit=4096) == min(largest, 4096)
        assert max(calls) <= 4096 and len(calls) <= 2 * 13 + 1  # doubling then bisection: about 2·log2(limit)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--seq-len", "0", "--seq-len: '0' is not a positive integer"),
        ("--micro-batch", "1,-1", "--micro-batch: '-1' is not a positive integer"),
        ("--grad-accum", "x", "--grad-accum: 'x' is not a positive integer"),
        ("--seq-len", "1e3", "--seq-len: '1e3' is not a positive integer"),
        ("--precision", "bf17", "--precision: unknown precision 'bf17'"),
        ("--memory-limit-gb", "0", "--memory-limit-gb must be positive"),
        ("--steps", "0", "--steps must be at least 1"),
    ],
)
def test_bad_input_is_one_line(tmp_path, option, value, message):
    result = invoke("bench", "--model", "debug", option, value, "--out", str(tmp_path))
    assert isinstance(result.exception, UserError), result.output
    assert str(result.exception).startswith(message) and "\n" not in str(result.exception)
    assert not (tmp_path / "bench.csv").exists()


def test_model_that_cannot_fit_micro_batch_one_is_one_line(tmp_path):
    for extra in ([], ["--find-max-batch"]):
        result = invoke(
            "bench",
            "--model",
            "llama3-8b",
            "--seq-len",
            "2048",
            "--memory-limit-gb",
            "4",
            "--out",
            str(tmp_path),
            *extra,
        )
        assert isinstance(result.exception, UserError), result.output
        message = str(result.exception)
        assert "cannot fit even micro-batch 1 at seq len 2048" in message and "\n" not in message


def test_parse_positive_ints_sorts_and_dedupes():
    assert parse_positive_ints("--seq-len", " 1024,512 ,512") == [512, 1024]
    for text in ("", "²", "+4", "4.0", "1,,2"):
        with pytest.raises(UserError):
            parse_positive_ints("--seq-len", text)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "debug", "--precision", "fp32,bf17"], "error: --precision: unknown precision 'bf17'"),
        (["--model", "llama3-8b", "--memory-limit-gb", "4"], "error: llama3-8b cannot fit even micro-batch 1"),
    ],
)
def test_console_command_exits_2_with_one_line(tmp_path, argv, message):
    proc = subprocess.run(
        [sys.executable, "-m", "dlx", "bench", *argv, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1 and proc.stdout == ""


def test_table_says_when_mfu_exceeds_100_percent():
    from dlx.bench.results import markdown_table, point_row

    fixed = {"model": "debug", "device": "CPU", "data": "synthetic", "compile": "off"}
    row = point_row(
        fixed,
        BenchPoint(16, 1, 1, "bf16"),
        "ok",
        it_per_s=1.0,
        tokens_per_s=16.0,
        step_s=1.0,
        data_wait_s=0.0025,
        forward_s=0.3,
        backward_s=0.6,
        optimizer_s=0.1,
        optimizer_pct=10.0,
        weight_cast_pct=1.5,
        peak_mem_gb=0.5,
        est_mem_gb=0.1,
        tflops=0.003,
        tflops_dense=0.0028,
        mfu=3.2,
        mfu_dense=3.0,
        peak_tflops=0.0009,
        peak_source="probe",
    )
    table = markdown_table([row], ["# head"])
    start = "| bf16 | 16 | 1 | 1 | 1 | 16 | 1000 (300 / 600 / 100) | 11.5 (10.0 + 1.5) | 2.5 |"
    assert f"{start} n/a / n/a | n/a / n/a | 0.5 (0.1) | 0.003 | 320.0% (300.0%) |" in table
    assert "GPU columns n/a: NVML samples NVIDIA GPUs only" in table
    assert "MFU above 100 % (bf16)" in table
    counters = {"gpu_util_pct": 97.4, "mem_util_pct": 41.0, "tensor_active_pct": 33.3, "dram_active_pct": 52.6}
    with_gpu = markdown_table([{**row, **counters}], ["# head"])
    assert f"{start} 97 / 41 | 33 / 53 | 0.5 (0.1) |" in with_gpu and "GPU columns n/a" not in with_gpu
    assert "MFU above 100 %" not in markdown_table([{**row, "mfu": 0.5}], ["# head"])


def test_a_prepared_dataset_instead_of_synthetic_tokens(tmp_path):
    from train_helpers import make_dataset

    dataset = make_dataset(tmp_path / "data")
    result = invoke(
        "bench",
        "--model",
        "debug",
        "--data",
        str(dataset),
        "--seq-len",
        "16",
        "--micro-batch",
        "1,2",
        "--steps",
        "1",
        "--warmup",
        "1",
        "--out",
        str(tmp_path / "bench"),
    )
    assert result.exit_code == 0, result.output
    _, rows = read_csv(tmp_path / "bench" / "bench.csv")
    assert [(r["data"], r["micro_batch"], r["status"]) for r in rows] == [
        (str(dataset), "1", "ok"),
        (str(dataset), "2", "ok"),
    ]
    missing = invoke("bench", "--model", "debug", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "b2"))
    assert isinstance(missing.exception, UserError) and "does not exist" in str(missing.exception)


def test_document_mask_is_part_of_a_points_key_and_changes_what_is_trained(tmp_path):
    import numpy as np

    from dataset_helpers import write_dataset

    tokens = np.random.default_rng(0).integers(1, 512, 4096)
    tokens[::10] = 0  # eos_id 0: a document boundary inside every window of 16 tokens
    data = write_dataset(tmp_path / "data", {"train": [tokens], "val": [tokens[:256]]}, vocab_size=512)
    out = tmp_path / "bench"
    argv = ["bench", "--model", "debug", "--data", str(data), "--seq-len", "16", "--micro-batch", "2"]
    argv += ["--precision", "fp32", "--steps", "1", "--warmup", "0", "--out", str(out)]
    for extra in (["--document-mask"], []):
        result = invoke(*argv, *extra)
        assert result.exit_code == 0, result.output
    columns, rows = read_csv(out / "bench.csv")
    assert columns.index("document_mask") == columns.index("compile") + 1
    assert [(r["document_mask"], r["status"]) for r in rows] == [("on", "ok"), ("off", "ok")]
    table = (out / "bench.md").read_text()
    assert f"{data} data, document mask, compile off" in table and f"{data} data, compile off" in table

    # A CSV written before the column existed: its rows measured without the mask, and a re-run skips them.
    lines = (out / "bench.csv").read_text().splitlines()
    at = columns.index("document_mask")
    old = [",".join(f for i, f in enumerate(line.split(",")) if i != at) for line in lines if ",on," not in line]
    (out / "bench.csv").write_text("\n".join(old) + "\n")
    rerun = invoke(*argv)
    assert rerun.exit_code == 0 and "skipped" in rerun.output, rerun.output

    cpu = torch.device("cpu")
    losses = [
        measure_point(
            BenchSetup("debug", cpu, str(data), steps=1, warmup=0, document_mask=m), BenchPoint(16, 2, 1, "fp32")
        )["loss"]
        for m in (True, False)
    ]
    assert losses[0] != losses[1]  # the same weights and windows: only the mask differs


def test_document_mask_needs_a_dataset_whose_vocabulary_fits_the_model(tmp_path):
    from dataset_helpers import write_dataset

    synthetic = invoke("bench", "--model", "debug", "--document-mask", "--out", str(tmp_path / "b"))
    assert isinstance(synthetic.exception, UserError)
    assert str(synthetic.exception) == (
        "--document-mask needs --data DATASET: synthetic tokens have no document boundaries"
    )
    data = write_dataset(tmp_path / "data", {"train": [list(range(1, 1000))]}, vocab_size=1000)
    too_big = invoke("bench", "--model", "debug", "--data", str(data), "--out", str(tmp_path / "b"))
    assert isinstance(too_big.exception, UserError)
    message = str(too_big.exception)
    assert "vocab_size 1,000, larger than the 512 of --model debug" in message and "\n" not in message
    assert not (tmp_path / "b").exists()
