"""`RunProgress`: where a training run stands, what it logged, its checkpoints and how it ended. The loop, `finish`
and the observers (a spike rollback) change it; everything else a run holds is fixed once `build_run` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlx.metrics.logger import EVAL_FILE, METRICS_FILE, read_jsonl
from dlx.train.rundir import checkpoint as ckpt


@dataclass
class RunProgress:
    """What happened: where the run stands, what it logged, its checkpoints, and how it ended."""

    state: ckpt.TrainerState
    """The step, the tokens seen, the batches skipped, the loader's position: what a checkpoint saves."""
    last_checkpoint: Path | None = None
    """The newest complete checkpoint: this run's latest, or the one it resumed from."""
    last_save: ckpt.PendingSave | None = None
    """The latest save this run started; with checkpoint.async it may still be writing."""
    records: list[dict[str, Any]] = field(default_factory=list)
    resumed_records: int = 0
    """How many of `records` a resumed run read back from metrics.jsonl (this process logged the rest)."""
    eval_records: list[dict[str, Any]] = field(default_factory=list)
    verdict: Any = None
    """The bottleneck verdict, once the run has finished (rank 0)."""
    stopped_early: bool = False
    """A signal reached some rank and all ranks stopped after the same step."""

    @property
    def step(self) -> int:
        """The last optimizer step done (0 before the first)."""
        return self.state.step

    def advance(self, step: int, tokens: int) -> None:
        """Optimizer step `step` is done; it read `tokens` tokens."""
        self.state.step, self.state.tokens_seen = step, self.state.tokens_seen + tokens

    def wait_for_save(self) -> None:
        """Wait for a background save still writing; it is then the last checkpoint."""
        if self.last_save is not None and not self.last_save.settled:
            self.last_checkpoint = self.last_save.wait()


def read_progress(run_dir: Path, state: ckpt.TrainerState, last: Path | None) -> RunProgress:
    """Where a run starts: a resumed run's report covers the whole run, so the records before its checkpoint (the
    metrics logger kept only those) are read back."""
    records = read_jsonl(run_dir / METRICS_FILE)
    evals = read_jsonl(run_dir / EVAL_FILE)
    return RunProgress(state, last, records=records, resumed_records=len(records), eval_records=evals)
