"""The fault matrix: run the test of every cell, record pass/fail per cell in BENCHMARKS.md ("Fault matrix").

Runs `pytest -m faults tests` (the matrix's own suite, tests/test_faults*.py) and then the cells whose tests live
elsewhere (named in CELLS), each run with --junitxml, every process on one CPU thread. A cell's result is its test's
outcome in this run: pass, FAIL, known failure (an xfail(strict=True): a bug found and reported, not yet fixed; the
reason is printed under the table), error or skipped. Tests the marker selects that no cell names are listed too,
so that nothing runs unrecorded. Exit status 1 when any cell failed unexpectedly or errored.

Run:  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fault_matrix.py   (appends to BENCHMARKS.md; --no-record to print)
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, so that `peers` imports as a package
from peers.record import ROOT, environment, publish

WATCHED = ["src/dlx", "tests"]
SECTION = "Fault matrix"
INTRO = (
    "Measured by `benchmarks/fault_matrix.py`; see its docstring and the docstrings of tests/test_faults*.py for "
    "what each cell injects and checks. One row per cell (fault × moment) and test; *known failure* is an "
    "xfail(strict=True) test: a bug found and reported, not yet fixed."
)
SIGNALLED = "no process left, nothing in /dev/shm, newest checkpoint loads, resume = uninterrupted run bit for bit"

_F, _FR = "tests/integration/test_faults.py", "tests/integration/test_faults_ddp.py"
CELLS: list[tuple[str, str, str]] = [
    *[
        (s, f"dlx pretrain: {what}", f"{_F}::test_pretrain_signalled[{moment}-{s}]")
        for moment, what in (("step", "training step"), ("save", "checkpoint save"), ("eval", "evaluation"))
        for s in ("SIGINT", "SIGTERM", "SIGKILL")
    ],
    *[(s, "dlx prepare (2 workers)", f"{_F}::test_prepare_signalled[{s}]") for s in ("SIGINT", "SIGTERM", "SIGKILL")],
    *[
        (s, "2-rank DDP, rank 1 signalled", f"{_FR}::test_ddp_rank_signalled[{s}]")
        for s in ("SIGINT", "SIGTERM", "SIGKILL")
    ],
    *[
        (s, "2-rank DDP, rank 1 signalled: rank 0 names the signal", f"{_FR}::test_ddp_stop_names_the_signal[{s}]")
        for s in ("SIGINT", "SIGTERM")
    ],
    (
        "one flipped byte in a shard",
        "dlx data verify; dlx pretrain (loader workers)",
        "tests/integration/test_faults_data.py::test_a_flipped_byte_is_named_by_data_verify_and_the_run",
    ),
    (
        "one flipped byte in a shard",
        "dlx prepare output, dlx data verify",
        "tests/integration/test_prepare.py::test_cli_prepare_info_and_verify_catches_one_flipped_byte",
    ),
    (
        "one flipped byte in a shard",
        "TokenLoader in-process, the first batch that reads it",
        "tests/unit/test_loader.py::test_a_changed_shard_stops_the_first_batch_that_reads_it",
    ),
    (
        "one flipped byte in a shard",
        "TokenLoader workers, in the background",
        "tests/integration/test_loader_workers.py::test_a_changed_shard_is_found_by_the_workers_while_they_build_batches",
    ),
    (
        "one flipped byte: a token id past the vocabulary",
        "dlx pretrain reads it (data.verify false)",
        "tests/integration/test_faults_data.py::test_a_flipped_byte_past_the_vocabulary_is_named_by_the_run",
    ),
    (
        "truncated newest checkpoint",
        "--resume",
        "tests/integration/test_train_resume.py::test_a_truncated_newest_checkpoint_falls_back_to_the_previous_one",
    ),
    (
        "disk full (tmpfs)",
        "checkpoint save",
        "tests/integration/test_faults_disk.py::test_a_full_filesystem_during_a_save",
    ),
    (
        "file size limit (RLIMIT_FSIZE)",
        "checkpoint save",
        "tests/integration/test_faults_disk.py::test_a_file_size_limit_during_a_save",
    ),
    (
        "a failing write",
        "checkpoint save",
        "tests/integration/test_train_resume.py::test_a_failed_save_is_one_line_and_leaves_the_previous_checkpoint",
    ),
    (
        "NaN loss, nan_policy stop",
        "training step",
        "tests/integration/test_train_run.py::test_nan_loss_stops_naming_the_step_and_the_last_good_checkpoint",
    ),
    (
        "NaN loss, nan_policy skip",
        "training step",
        "tests/integration/test_train_run.py::test_nan_loss_skips_the_batch_under_policy_skip",
    ),
    (
        "bad recipe file (hypothesis)",
        "dlx pretrain start",
        "tests/integration/test_faults_recipes.py::test_a_broken_recipe_file_is_one_line",
    ),
    (
        "bad overrides (hypothesis)",
        "dlx pretrain start",
        "tests/integration/test_faults_recipes.py::test_broken_overrides_are_one_line",
    ),
    (
        "negative or non-finite numbers (hypothesis)",
        "dlx pretrain start",
        "tests/integration/test_faults_recipes.py::test_a_negative_or_non_finite_number_is_refused_naming_its_key",
    ),
    (
        "bad recipe through the CLI",
        "dlx pretrain start",
        "tests/integration/test_faults_recipes.py::test_cli_exit_2_one_line_no_traceback",
    ),
    (
        "unpickling calls in the source",
        "source scan",
        "tests/integration/test_faults_security.py::test_the_source_unpickles_nothing",
    ),
    (
        "pickled payloads planted in a checkpoint",
        "load, resume",
        "tests/integration/test_faults_security.py::test_planted_pickles_are_refused_without_running",
    ),
    (
        "pickled payload in train_state.pt",
        "--resume",
        "tests/integration/test_train_resume.py::test_a_pickled_payload_is_refused_without_running_it",
    ),
]
"""(fault, moment, pytest node id). The signal cells all check the same things: see SIGNALLED."""


@dataclass
class Outcome:
    result: str
    seconds: float
    reason: str = ""


def run_pytest(args: list[str], junit: Path) -> float:
    """pytest ARGS with its results in `junit`; the wall time in seconds (its exit status is read from the XML)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={junit}", *args]
    print("$", " ".join(command[1:]), flush=True)
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, check=False)
    return time.perf_counter() - start


def read_junit(path: Path) -> dict[str, Outcome]:
    """node id → outcome, from a pytest junit XML file."""
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.test_x, or tests.test_x.TestClass
        n_module = next((i + 1 for i, part in enumerate(parts) if part.startswith("test_")), len(parts))
        node = "::".join(["/".join(parts[:n_module]) + ".py", *parts[n_module:], case.get("name", "")])
        seconds = float(case.get("time", 0))
        failure, error, skipped = case.find("failure"), case.find("error"), case.find("skipped")
        if failure is not None:
            outcomes[node] = Outcome("FAIL", seconds, (failure.get("message") or "").splitlines()[0][:200])
        elif error is not None:
            outcomes[node] = Outcome("error", seconds, (error.get("message") or "").splitlines()[0][:200])
        elif skipped is not None and skipped.get("type") == "pytest.xfail":
            outcomes[node] = Outcome("known failure", seconds, skipped.get("message", ""))
        elif skipped is not None:
            outcomes[node] = Outcome("skipped", seconds, skipped.get("message", ""))
        else:
            outcomes[node] = Outcome("pass", seconds)
    return outcomes


def matrix(outcomes: dict[str, Outcome]) -> tuple[list[str], list[str]]:
    """The table's lines, and one line per known failure or unexpected result with its reason."""
    rows = ["| fault | moment | test | result | s |", "|---|---|---|---|---|"]
    notes = []
    named = {node for _, _, node in CELLS}
    extra = [("(faults-marked, no cell named)", "", node) for node in sorted(outcomes) if node not in named]
    for fault, moment, node in [*CELLS, *extra]:
        outcome = outcomes.get(node, Outcome("not run", 0.0, "not collected: renamed or removed?"))
        result = f"**{outcome.result}**" if outcome.result != "pass" else "pass"
        rows.append(f"| {fault} | {moment} | `{node}` | {result} | {outcome.seconds:.1f} |")
        if outcome.result != "pass":
            notes.append(f"- `{node}`: {outcome.result}: {outcome.reason}")
    return rows, notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true", help="print only; do not append to BENCHMARKS.md")
    args = parser.parse_args()
    header = environment(WATCHED)
    elsewhere = [node for _, _, node in CELLS if not Path(node.split("::")[0]).name.startswith("test_faults")]
    with tempfile.TemporaryDirectory(prefix="dlx-fault-matrix-") as tmp:
        junits = [Path(tmp) / "faults.xml", Path(tmp) / "elsewhere.xml"]
        wall = run_pytest(["-m", "faults", "tests"], junits[0])
        wall += run_pytest(elsewhere, junits[1])
        outcomes = {node: o for junit in junits if junit.exists() for node, o in read_junit(junit).items()}
    rows, notes = matrix(outcomes)
    counts = {r: sum(o.result == r for o in outcomes.values()) for r in ("pass", "known failure", "FAIL", "error")}
    summary = ", ".join(f"{n} {r}" for r, n in counts.items() if n) + f"; {wall:.0f} s of pytest in all"
    lines = [
        f"### {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        "",
        *header,
        f"- pytest: `pytest -m faults tests`, then the {len(elsewhere)} cells tested elsewhere by node id "
        f"(OMP_NUM_THREADS=1); {summary}",
        f"- every signal cell checks: {SIGNALLED} (DDP: torchrun exits 1; after a SIGKILL the resume is "
        "also done in one process, equal within float rounding)",
        "",
        *rows,
    ]
    if notes:
        lines += ["", "Not passing:", "", *notes]
    publish(SECTION, INTRO, lines, record=not args.no_record)
    missing = [node for _, _, node in CELLS if node not in outcomes]
    return 1 if counts["FAIL"] or counts["error"] or missing else 0


if __name__ == "__main__":
    sys.exit(main())
