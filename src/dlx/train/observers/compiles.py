"""`train.compile`'s account: the compile cache's header line (cold or warm, `dlx.train.build.compile_cache`), and
what torch.compile compiled (`dlx.metrics.compiles`) after the first step, each validation and each task evaluation:
one console line with the graphs and seconds, one more per recompile naming the function and the guard that failed,
an event in events.jsonl, and `compiles` and `compile_seconds` in the step record that paid for them.

What compiles once, by design: the blocks' training graphs (forward and backward) and the loss's chunk math at step 1,
and the blocks' no-gradient graph at the first validation (its batches have the training shape; every later
validation reuses it). Generation and lm-eval's requests, whose shapes change from call to call, run the blocks'
eager code (`dlx.model.generate.run_eagerly`) and compile nothing.
"""

from __future__ import annotations

from typing import Any

from dlx.metrics.compiles import Compiled, CompileLog, describe
from dlx.train.build.compile_cache import CompileCache
from dlx.train.observers.base import Observer, RunView
from dlx.train.rundir import folder


class CompileObserver(Observer):
    order = 35  # after the task evaluation (30): its compiles are counted once it is done

    def __init__(self, cache: CompileCache, resumed_at: int) -> None:
        self.cache, self.resumed_at = cache, resumed_at
        self.log = CompileLog()
        self.run: RunView | None = None
        self.total: list[Compiled] = []

    def attach(self, run: RunView) -> None:
        self.run = run

    def header(self) -> list[str]:
        return [self.cache.header(self.resumed_at)]

    def columns(self, step: int) -> dict[str, Any]:
        compiled = self.account(f"by step {step}", step)
        if compiled and step == self.resumed_at + 1 and self.run is not None and self.run.env.is_main:
            self.cache.mark_warm(sum(c.seconds for c in compiled))
        if not compiled:
            return {}
        return {"compiles": len(compiled), "compile_seconds": round(sum(c.seconds for c in compiled), 3)}

    def on_eval(self, record: dict[str, Any]) -> None:
        self.account(f"in the evaluation at step {record['step']}", record["step"])

    def on_tasks(self, record: dict[str, Any]) -> None:
        self.account(f"in the task evaluation at step {record['step']}", record["step"])

    def between_steps(self, step: int) -> None:
        self.account(f"between steps after step {step}", step)

    def finish(self, step: int) -> None:
        self.account(f"at the end (step {step})", step)
        if self.run is not None and self.total:
            recompiles = sum(1 for c in self.total if c.recompile)
            seconds = sum(c.seconds for c in self.total)
            self.run.console.print(
                f"compile total: {len(self.total)} graph(s) in {seconds:.1f} s, {recompiles} recompile(s)"
            )

    def account(self, where: str, step: int) -> list[Compiled]:
        """What was compiled since the last look: said on the console and in events.jsonl (rank 0)."""
        compiled = self.log.take()
        if not compiled or self.run is None:
            return compiled
        self.total += compiled
        for line in describe(compiled, where):
            self.run.console.print(line)
        if self.run.env.is_main:
            recompiles = [
                {"function": c.function, "seconds": round(c.seconds, 3), "reason": c.recompile}
                for c in compiled
                if c.recompile
            ]
            folder.append_event(
                self.run.run_dir,
                event="compile",
                step=step,
                where=where,
                graphs=len(compiled),
                seconds=round(sum(c.seconds for c in compiled), 3),
                recompiles=recompiles,
            )
        return compiled
