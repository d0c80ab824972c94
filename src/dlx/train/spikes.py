"""Loss spikes (train.spike_policy): a step whose loss exceeds the mean of the last `train.spike_window` accepted
losses by `train.spike_sigma` standard deviations is a spike; no judgement before the window is full. Checkpoints
keep the window, so a resumed or rolled-back run judges from its first step.

- `skip`: the spike's update is not applied (its batch is still consumed), as OLMo-core does.
- `rollback`: spikes are skipped as well; after `train.spike_patience` consecutive ones, the run reloads the newest
  checkpoint older than the first of them and trains on from there, skipping exactly the data windows of the spiking
  steps: the steps between the checkpoint and the first spike see their own batches again (the loader position is a
  pure function of the seed and the position), then the loader jumps to the position after the last spiking step.
  Checkpoints newer than the one reloaded belong to the abandoned branch and are set aside as
  `step-N.rolled-back`.

Every rank takes the same decisions: they read the loss all ranks agreed on (`trainer.agree_on_step`). Each spike,
skip and rollback goes to events.jsonl and the console, and the report's event list.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path
from typing import Any

from dlx.train import checkpoint as ckpt
from dlx.train import folder
from dlx.train.observer import Observer

ROLLED_BACK_SUFFIX = ".rolled-back"


class SpikeGuard(Observer):
    """Judges each step's loss and, under `rollback`, restores the run between steps."""

    def __init__(self, run: Any):
        """`run`: the `dlx.train.run.Run` it guards (it restores that run's pieces on a rollback; typed loosely, as
        run.py builds the guard)."""
        cfg = run.config.train
        self.run = run
        self.policy, self.sigma, self.patience = cfg.spike_policy, cfg.spike_sigma, cfg.spike_patience
        self.window: deque[float] = deque(run.progress.state.spike_window, maxlen=cfg.spike_window)
        self.streak: list[int] = []
        """The current run of consecutive spiking steps."""
        self.positions: dict[int, dict[str, Any]] = {}
        """The loader's position after each recent step (rollback only): where the data resumes past a spike."""
        self.jump: tuple[int, dict[str, Any]] | None = None
        """(after this step, move the loader to this position): the pending skip of a rollback's spiking windows."""
        self.counts = {"spikes": 0, "rollbacks": 0}
        self.rewarmup = self.rewarmed = cfg.spike_rewarmup
        """train.spike_rewarmup, and how many of its steps have had their learning rate scaled since the rollback."""

    def header(self) -> list[str]:
        if self.policy == "off":
            return []
        return [
            f"Loss spikes: {self.policy} a step whose loss exceeds the mean of the last {self.window.maxlen} by "
            f"{self.sigma:g} σ" + (f"; roll back after {self.patience} in a row" if self.policy == "rollback" else "")
        ]

    def saved_window(self) -> list[float]:
        """The window as a checkpoint keeps it (empty when the policy is off)."""
        return list(self.window) if self.policy != "off" else []

    def is_spike(self, step: int, loss: float) -> bool:
        """Whether `step`'s (finite) loss is a spike; an accepted loss joins the window."""
        if self.policy == "off":
            return False
        full = len(self.window) == self.window.maxlen
        mean = math.fsum(self.window) / len(self.window) if self.window else 0.0
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in self.window) / len(self.window)) if self.window else 0.0
        if full and loss > mean + self.sigma * std:
            self.streak.append(step)
            self.counts["spikes"] += 1
            self._report("loss_spike", step, loss, mean, std)
            return True
        self.window.append(loss)
        self.streak.clear()
        return False

    def _report(self, event: str, step: int, loss: float, mean: float, std: float) -> None:
        run = self.run
        sigmas = (loss - mean) / std if std > 0 else math.inf
        if run.env.is_main:
            folder.append_event(
                run.run_dir, event=event, step=step, loss=loss, window_mean=mean, window_std=std, action="skip"
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
        run = self.run
        self._rewarm()
        self.positions[step] = run.loader.state_dict()
        self._forget_before(step - run.config.checkpoint.every * (run.config.checkpoint.keep_last + 1))
        if self.jump is not None and self.jump[0] == step:
            run.loader.load_state_dict(self.jump[1])
            self.jump = None
        if len(self.streak) >= self.patience:
            self.roll_back()

    def _forget_before(self, step: int) -> None:
        for old in [s for s in self.positions if s < step]:
            del self.positions[old]

    def roll_back(self) -> bool:
        """Reload the newest checkpoint older than the streak's first spike; False (and go on skipping) if none."""
        run, first, last = self.run, self.streak[0], self.streak[-1]
        self.streak = []
        run.progress.wait_for_save()
        older = [p for p in ckpt.list_checkpoints(run.run_dir) if checkpoint_step(p) < first]
        if not older or last not in self.positions:
            run.console.warn(f"spikes at steps {first}-{last}: no checkpoint before step {first}; going on")
            return False
        loaded = ckpt.read_checkpoint(older[0])
        self._set_aside_newer(checkpoint_step(older[0]))
        progress = run.progress
        progress.state = ckpt.apply_checkpoint(
            loaded, run.strategy, run.scheduler, run.precision.scaler, say=run.console.warn
        )
        run.strategy.zero_grad()
        run.loader.load_state_dict(progress.state.loader)
        self.window = deque(progress.state.spike_window, maxlen=self.window.maxlen)  # the replayed steps refill it
        progress.last_checkpoint, progress.last_save = older[0], None
        self.jump = (first - 1, self.positions[last])
        if progress.state.step == first - 1:
            run.loader.load_state_dict(self.positions[last])
            self.jump = None
        self.counts["rollbacks"] += 1
        self._announce(first, last)
        self.rewarmed = 0
        self._rewarm()
        return True

    def _rewarm(self) -> None:
        """After a rollback, scale the next step's learning rate (already set by the schedule) by k / spike_rewarmup
        for its k-th step; the logged lr is the one applied."""
        if self.rewarmed >= self.rewarmup:
            return
        self.rewarmed += 1
        scheduler = self.run.scheduler
        lrs = [lr * self.rewarmed / self.rewarmup for lr in scheduler.get_last_lr()]
        for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        scheduler._last_lr = lrs  # what get_last_lr() reports (and the step record logs) for that step

    def _set_aside_newer(self, step: int) -> None:
        """Checkpoints after `step` are of the abandoned branch: renamed so that no resume takes them (rank 0)."""
        if not self.run.env.is_main:
            return
        for path in ckpt.list_checkpoints(self.run.run_dir):
            if checkpoint_step(path) > step:
                path.rename(free_name(path, ROLLED_BACK_SUFFIX))

    def _announce(self, first: int, last: int) -> None:
        run = self.run
        skipped = last - first + 1
        if run.env.is_main:
            folder.append_event(
                run.run_dir,
                event="rollback",
                step=last,
                to_step=run.progress.step,
                checkpoint=run.progress.last_checkpoint,
                skipped_steps=[first, last],
            )
        run.console.warn(
            f"step {last}: {skipped} spikes in a row (steps {first}-{last}); rolled back to "
            f"{run.progress.last_checkpoint} (step {run.progress.step}); the data of steps {first}-{last} will be "
            "skipped"
        )


def checkpoint_step(path: Path) -> int:
    return int(path.name.split("-")[1])


def free_name(path: Path, suffix: str) -> Path:
    """`path` + `suffix`, or + `suffix`-2, -3 ... when a step was rolled back before."""
    candidate, n = path.with_name(path.name + suffix), 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}{suffix}-{n}")
    return candidate
