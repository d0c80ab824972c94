"""`StageObserver`: what a stage of `data.stages` changes beside the data, and what the run records of it.

The loader switches its own source at each boundary (`dlx.data.stages.StagedLoader`) and the loop takes each step's
accumulation from the step plan; this observer, from the same stage plan (`dlx.train.build.stages`):
- sets the stage's RoPE (`model.rope_theta`, `model.rope_scaling`) before its first step, and before the first step
  of a run resumed inside it;
- writes `{"event": "stage", "step", "stage", "last_step", "seq_len", "micro_batch_size", "grad_accum",
  "tokens_per_step", "mix", "rope_theta", "rope_scaling"}` to events.jsonl before each stage's first step (`mix`: the
  requested share of each source), and `{"event": "stage_end", "step", "stage", "source_tokens", "mix"}` after its
  last one (`source_tokens`: the training tokens each source supplied in the stage, all ranks together);
- adds `stage` (its index) and `stage_tokens` (the tokens each source has supplied in it so far) to every metrics
  record;
- prints the plan in the start-up header and a line at each boundary.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dlx.train.build.stages import Stage, StagePlan
from dlx.train.observers.base import Observer, RunView
from dlx.train.rundir import folder


class StageObserver(Observer):
    order = 5  # after the attention kernel's header line, before the counters'

    def __init__(self, plan: StagePlan) -> None:
        self.plan = plan
        self._run: RunView | None = None

    def attach(self, run: RunView) -> None:
        """The RoPE of the stage the run goes on in (its own or carried over)."""
        self._run = run
        self._set_rope(self.plan.at(run.progress.step + 1))

    def header(self) -> list[str]:
        return self.plan.header_lines()

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        stage = self.plan.at(step)
        if step == stage.first_step:
            self._begin(stage)
        yield

    def columns(self, step: int) -> dict[str, Any]:
        stage = self.plan.at(step)
        return {"stage": stage.index, "stage_tokens": self.plan.stage_tokens(stage.index, step - stage.first_step + 1)}

    def between_steps(self, step: int) -> None:
        stage = self.plan.at(step)
        if step == stage.last_step and self._run is not None and self._run.env.is_main:
            tokens = self.plan.stage_tokens(stage.index)
            folder.append_event(
                self._run.run_dir,
                event="stage_end",
                step=step,
                stage=stage.index,
                source_tokens=tokens,
                mix=stage.weights,
            )

    def _begin(self, stage: Stage) -> None:
        run = self._run
        assert run is not None
        self._set_rope(stage)
        if stage.index:
            run.console.print(
                f"stage {stage.index} from step {stage.first_step:,}: {stage.mixture()}, seq_len {stage.seq_len:,} "
                f"(micro-batch {stage.micro_batch_size} × {stage.grad_accum}), rope_theta {stage.rope['rope_theta']:g}"
            )
        if run.env.is_main:
            folder.append_event(
                run.run_dir,
                event="stage",
                step=stage.first_step,
                stage=stage.index,
                last_step=stage.last_step,
                seq_len=stage.seq_len,
                micro_batch_size=stage.micro_batch_size,
                grad_accum=stage.grad_accum,
                tokens_per_step=self.plan.tokens_per_step,
                mix=stage.weights,
                **stage.rope,
            )

    def _set_rope(self, stage: Stage) -> None:
        model = self._run.strategy.model if self._run is not None else None
        if model is None:
            return
        args = model.args
        rope_scaling = args.model_dump(mode="json")["rope_scaling"]
        if (args.rope_theta, rope_scaling) != (stage.rope["rope_theta"], stage.rope["rope_scaling"]):
            model.set_rope(stage.rope["rope_theta"], stage.rope["rope_scaling"])
