"""The end of a run, after its last step: the last checkpoint and evaluation (or, for a run a signal stopped, the
checkpoint an orderly stop needs and the line that says how to continue), the observers' `finish`, and on rank 0 the
bottleneck verdict and report.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlx.metrics.logger import read_jsonl
from dlx.metrics.report import write_report
from dlx.metrics.verdict import Hardware, bottleneck_verdict
from dlx.train.loop.records import run_eval
from dlx.train.loop.saving import save, verify_data_read, wait_for_save
from dlx.train.observers.build import report_files
from dlx.train.rundir import checkpoint as ckpt
from dlx.train.rundir import folder

if TYPE_CHECKING:
    from dlx.train.run import Run


def finish(run: Run) -> None:
    """Last evaluation and checkpoint (or the one an orderly stop needs), the observers' `finish`, then the verdict and
    the report."""
    progress, step = run.progress, run.progress.step
    wait_for_save(run)
    verify_data_read(run)
    this_step = ckpt.checkpoint_dir(run.run_dir, step).name
    at_step = progress.last_checkpoint is not None and progress.last_checkpoint.name == this_step
    last = progress.last_save
    lacks_weights = last is not None and not last.state.full_weights and run.config.checkpoint.full_weights == "last"
    if step > 0 and not (at_step and not lacks_weights):
        save(run, final=True)
    if progress.stopped_early:
        if run.env.is_main:
            folder.append_event(run.run_dir, event="stopped", step=step, signal=run.stop.signal_name)
        run.console.warn(
            f"stopped by {run.stop.signal_name} after step {step}; checkpoint {progress.last_checkpoint}; "
            f"continue with --resume --run-dir {run.run_dir}"
        )
    elif run.config.eval.every and not (progress.eval_records and progress.eval_records[-1]["step"] == step):
        run_eval(run, step)
    run.observers.finish(step)
    if progress.records and run.env.is_main:
        report(run, step)
    run.console.print(f"run folder: {run.run_dir} (report.md, metrics.jsonl, checkpoints/)")


def report(run: Run, step: int) -> None:
    """Rank 0: the bottleneck verdict, report.md and its plots, then the observers' `on_report` (W&B)."""
    progress = run.progress
    progress.verdict = bottleneck_verdict(progress.records, hardware=hardware(run))
    run.console.print(str(progress.verdict))
    # data.path: one source; data.stages: per stage, in the Stages section (from the events)
    weights = {source.name: source.weight for source in run.data_info.sources} if run.stages is None else {}
    records, evals = progress.records, progress.eval_records
    events = read_jsonl(run.run_dir / folder.EVENTS_FILE)  # resumes, loss spikes, rollbacks, skipped batches, stops
    write_report(run.run_dir, records, progress.verdict, run.header, evals, source_weights=weights, events=events)
    run.observers.on_report(step, progress.verdict, report_files(run.run_dir))


def hardware(run: Run) -> Hardware:
    from dlx.device import supports_native_bf16

    compiled = run.config.train.compile
    return Hardware(run.device.type, run.precision.name, supports_native_bf16(run.device), compiled)
