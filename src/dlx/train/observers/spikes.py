"""Loss spikes (train.spike_policy): a step whose loss exceeds the mean of the last `train.spike_window` accepted
losses by `train.spike_sigma` standard deviations is a spike; no judgement before the window is full. The guard is an
observer (`dlx.train.observers.base`): it judges in `veto_update`, before the optimizer step, and its state (the window,
the counts, the pending data skips) is saved in every checkpoint, so a resumed or rolled-back run judges from its
first step.

- `skip`: the spike's update is not applied (its batch is still consumed), as OLMo-core does.
- `rollback`: spikes are skipped as well; after `train.spike_patience` consecutive ones, the run reloads the newest
  checkpoint older than the first of them and trains on from there, skipping the data windows of the spiking steps:
  the steps between the checkpoint and the first spike see their own batches again (the loader position is a pure
  function of the seed and the position), then the loader jumps past the last spiking step. Skips accumulate: a later
  rollback to the same or an older checkpoint replays every earlier skip that lies after it, so no data a rollback
  skipped is read again. After `train.spike_max_rollbacks` rollbacks, the next one stops the run with one line.
  The guard decides; `build.restore.rewind` moves the run back, setting aside the checkpoints of the abandoned
  branch (`step-N.rolled-back`; `rundir.checkpoint.prune_checkpoints`'s one retention rule counts them toward
  `checkpoint.keep_last`, the oldest first) and marking their records in metrics.jsonl `"abandoned": true`. The
  rollbacks are counted from events.jsonl, the run's own history, so a run that stopped at the cap stops there again
  when resumed from an older checkpoint.

Every rank takes the same decisions: they read the loss all ranks agreed on (`trainer.agree_on_step`). Each spike,
skip and rollback goes to events.jsonl and the console, and the report's event list; a step record lists the steps
since the previous record whose update the guard left out (`skipped_updates`).
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Any

from dlx.data.stages import skip_problem
from dlx.errors import UserError
from dlx.parallel.distributed import main_decides
from dlx.train.build.restore import rewind
from dlx.train.observers.base import Observer, RunView
from dlx.train.rundir import checkpoint as ckpt
from dlx.train.rundir import folder
from dlx.train.rundir.folder import read_events

if TYPE_CHECKING:
    from dlx.train.config import TrainSection


class SpikeGuard(Observer):
    """Judges each step's loss before its update and, under `rollback`, restores the run between steps."""

    name = "spikes"
    order = 100  # last: a rollback between steps moves the run back after every other observer's work

    def __init__(self, cfg: TrainSection) -> None:
        """`cfg`: the recipe's train section (train.spike_*)."""
        self.policy, self.sigma, self.patience = cfg.spike_policy, cfg.spike_sigma, cfg.spike_patience
        self.max_rollbacks = cfg.spike_max_rollbacks
        self.window: deque[float] = deque(maxlen=cfg.spike_window)
        self.streak: list[int] = []
        """The current run of consecutive spiking steps."""
        self.positions: dict[int, dict[str, Any]] = {}
        """The loader's position after each recent step (rollback only): where the data resumes past a spike."""
        self.jumps: dict[int, dict[str, Any]] = {}
        """After step k, move the loader to this position: every data skip of the rollbacks so far on this branch."""
        self.counts = {"spikes": 0, "skipped": 0, "rollbacks": 0}
        self.vetoed: list[int] = []
        """Steps whose update was left out since the last step record."""
        self.rewarmup = self.rewarmed = cfg.spike_rewarmup
        """train.spike_rewarmup, and how many of its steps have had their learning rate scaled since the rollback."""
        self.run: RunView | None = None

    def attach(self, run: RunView) -> None:
        self.run = run
        self._count_past_rollbacks()

    def state_dict(self) -> dict[str, Any]:
        """The window, the counts and the pending skips (empty when the policy is off)."""
        if self.policy == "off":
            return {}
        jumps = {str(step): position for step, position in self.jumps.items()}
        return {"window": list(self.window), "counts": dict(self.counts), "jumps": jumps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window = deque(state.get("window", []), maxlen=self.window.maxlen)
        self.counts.update(state.get("counts", {}))
        self.jumps = {int(step): position for step, position in state.get("jumps", {}).items()}
        self._count_past_rollbacks()

    def _count_past_rollbacks(self) -> None:
        """The rollbacks the run's history (events.jsonl) holds, not only its checkpoint's count: a checkpoint saved
        before later rollbacks would give a restarted run a fresh allowance. Once attached (every rank, rank 0
        reads)."""
        if self.policy == "rollback" and self.run is not None:
            past = main_decides(lambda: len(read_events(self._run().run_dir, "rollback")))
            self.counts["rollbacks"] = max(self.counts["rollbacks"], past)

    def header(self) -> list[str]:
        if self.policy == "off":
            return []
        return [
            f"Loss spikes: {self.policy} a step whose loss exceeds the mean of the last {self.window.maxlen} by "
            f"{self.sigma:g} σ"
            + (
                f"; roll back after {self.patience} in a row, at most {self.max_rollbacks} times"
                if self.policy == "rollback"
                else ""
            )
        ]

    def veto_update(self, step: int, loss: float) -> bool:
        """Whether `step`'s (finite) loss is a spike; an accepted loss joins the window."""
        if self.policy == "off":
            return False
        full = len(self.window) == self.window.maxlen
        mean = math.fsum(self.window) / len(self.window) if self.window else 0.0
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in self.window) / len(self.window)) if self.window else 0.0
        if full and loss > mean + self.sigma * std:
            self.streak.append(step)
            self.vetoed.append(step)
            self.counts["spikes"] += 1
            self.counts["skipped"] += 1
            self._report(step, loss, mean, std)
            return True
        self.window.append(loss)
        self.streak.clear()
        return False

    def columns(self, step: int) -> dict[str, Any]:
        vetoed, self.vetoed = self.vetoed, []
        return {"skipped_updates": vetoed} if vetoed else {}

    def _report(self, step: int, loss: float, mean: float, std: float) -> None:
        run = self._run()
        sigmas = (loss - mean) / std if std > 0 else math.inf
        if run.env.is_main:
            folder.append_event(
                run.run_dir, event="loss_spike", step=step, loss=loss, window_mean=mean, window_std=std, action="skip"
            )
        run.console.warn(
            f"step {step}: loss {loss:.4f} is a spike ({sigmas:.1f} σ above the mean {mean:.4f} of the last "
            f"{len(self.window)}); update skipped (train.spike_policy: {self.policy})"
        )

    def due(self, step: int) -> bool:
        """A rollback is due (the streak reached the patience): the loop pauses the clock and checks for a stop."""
        return self.policy == "rollback" and len(self.streak) >= self.patience

    def between_steps(self, step: int) -> None:
        """Record the loader's position; apply a pending data skip; roll back when the streak reached the patience
        (the run's step is then the checkpoint's)."""
        if self.policy != "rollback":
            return
        run = self._run()
        self._rewarm()
        self.positions[step] = run.loader.state_dict()
        self._forget_before(step - run.config.checkpoint.every * (run.config.checkpoint.keep_last + 1))
        if step in self.jumps:  # kept: a later rollback to before `step` replays the skip
            run.loader.load_state_dict(self.jumps[step], steps_done=step)
        if len(self.streak) >= self.patience:
            self.roll_back()

    def _forget_before(self, step: int) -> None:
        for old in [s for s in self.positions if s < step]:
            del self.positions[old]

    def roll_back(self) -> bool:
        """Reload the newest checkpoint older than the streak's first spike; False (and go on skipping) if none."""
        run, first, last = self._run(), self.streak[0], self.streak[-1]
        self.streak = []
        run.progress.wait_for_save()
        older = [p for p in ckpt.list_checkpoints(run.run_dir) if ckpt.checkpoint_step(p) < first]
        if not older or last not in self.positions:
            run.console.warn(f"spikes at steps {first}-{last}: no checkpoint before step {first}; going on")
            return False
        crossing = skip_problem(run.loader, first - 1, self.positions[last])
        if crossing:
            run.console.warn(f"spikes at steps {first}-{last}: no rollback, {crossing}; going on")
            return False
        if self.counts["rollbacks"] >= self.max_rollbacks:
            raise UserError(
                f"step {last}: {last - first + 1} spikes in a row after {self.counts['rollbacks']} rollbacks "
                f"(train.spike_max_rollbacks); the run keeps spiking: lower train.lr, raise train.spike_sigma or "
                f"resume from {older[0]} with a larger train.spike_max_rollbacks"
            )
        skipped = {"from": self.positions.get(first - 1), "to": self.positions[last]}
        rewind(run, older[0])
        saved = run.progress.state.observers.get(self.name, {})  # the guard keeps its own counts and skips
        self.window = deque(saved.get("window", []), maxlen=self.window.maxlen)  # the replayed steps refill it
        to_step = run.progress.step
        self.jumps = {k: p for k, p in self.jumps.items() if to_step <= k < first}  # earlier skips still ahead
        self.jumps[first - 1] = self.positions[last]
        if to_step in self.jumps:  # the checkpoint was saved before this step's skip was applied
            run.loader.load_state_dict(self.jumps[to_step], steps_done=to_step)
        self.counts["rollbacks"] += 1
        self._announce(first, last, skipped)
        self.rewarmed = 0
        self._rewarm()
        return True

    def _rewarm(self) -> None:
        """After a rollback, scale the next step's learning rate (already set by the schedule) by k / spike_rewarmup
        for its k-th step; the logged lr is the one applied."""
        if self.rewarmed >= self.rewarmup:
            return
        self.rewarmed += 1
        self._run().scheduler.scale_last_lr(self.rewarmed / self.rewarmup)

    def _announce(self, first: int, last: int, skipped: dict[str, Any]) -> None:
        run = self._run()
        if run.env.is_main:
            folder.append_event(
                run.run_dir,
                event="rollback",
                step=last,
                to_step=run.progress.step,
                checkpoint=run.progress.last_checkpoint,
                skipped_steps=[first, last],
                skipped_loader=skipped,
                rollbacks=self.counts["rollbacks"],
            )
        run.console.warn(
            f"step {last}: {last - first + 1} spikes in a row (steps {first}-{last}); rolled back to "
            f"{run.progress.last_checkpoint} (step {run.progress.step}); the data of steps {first}-{last} will be "
            f"skipped (rollback {self.counts['rollbacks']} of at most {self.max_rollbacks})"
        )

    def _run(self) -> RunView:
        assert self.run is not None, "the guard is attached when the run is built"
        return self.run
