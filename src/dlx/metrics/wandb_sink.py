"""Weights & Biases from rank 0 (`log.wandb`; optional: `pip install 'dlx[wandb]'`): each training record, evaluation
and sample as it is written to the run folder, the resolved config at the start, and at the end the verdict,
report.md and the plots. The run feeds it through an observer (`dlx.train.observers.build.WandbObserver`).

W&B's own environment variables apply (WANDB_MODE=offline keeps the run in RUN/wandb/ for a later `wandb sync`).
The W&B run's id is kept in RUN/wandb-id, so `--resume` continues the same W&B run; records replayed after the
checkpoint carry the same values (resume is exact), and W&B keeps the copy it got first.

Decided failures: a missing package, or no credentials outside offline mode, are refused before anything is
written (`check_wandb`: one line naming the fix, exit 2). W&B failing once the run is under way (it cannot reach
its server at start) is one line on stderr, and the run goes on with its files only.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from dlx.atomic import atomic_write_text
from dlx.errors import UserError

ID_FILE = "wandb-id"
NOT_LOGGED = frozenset({"step", "warning"})


def check_wandb() -> None:
    """Refuse `log.wandb: true` before step 1 when wandb is missing, or has no credentials and is not offline."""
    try:
        import wandb
    except ImportError:
        raise UserError(
            "log.wandb is true but wandb is not installed: pip install 'dlx[wandb]' (or set log.wandb false)"
        ) from None
    if wandb.setup().settings.mode in ("offline", "dryrun", "disabled"):
        return
    if not wandb.login(prompt=False, verify=False):
        raise UserError(
            "log.wandb is true but W&B has no credentials: run `wandb login` or set WANDB_API_KEY (or "
            "WANDB_MODE=offline, then `wandb sync RUN/wandb/offline-run-*`), or set log.wandb false"
        )


class WandbSink:
    """One W&B run per dlx run folder; every method is a no-op once W&B has failed."""

    def __init__(
        self, run_dir: Path, project: str, name: str | None, config: dict[str, Any], warn: Callable[[str], None]
    ) -> None:
        import wandb

        self.wandb = wandb
        self.run_dir = Path(run_dir)
        self.warn = warn
        self.samples: list[list[Any]] = []
        run_id = _run_id(self.run_dir)
        try:
            self.run = wandb.init(
                project=project,
                name=name or self.run_dir.name,
                id=run_id,
                resume="allow",
                dir=str(self.run_dir),
                config=config,
            )
        except Exception as error:  # any W&B failure at start: the run goes on with its files (decided above)
            self.run = None
            warn(f"W&B: could not start a run ({type(error).__name__}: {error}); this run logs to its files only")

    def log(self, tag: str, record: dict[str, Any]) -> None:
        """The record's numbers as `tag/key` at the record's step."""
        if self.run is None:
            return
        values = {
            f"{tag}/{key}": value
            for key, value in record.items()
            if key not in NOT_LOGGED and isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        with self._guard():
            self.run.log(values, step=int(record["step"]))

    def log_sample(self, record: dict[str, Any]) -> None:
        """All samples so far as one table (W&B shows the latest), at the sample's step."""
        if self.run is None:
            return
        self.samples.append([record["step"], record["prompt"], record["text"]])
        with self._guard():
            table = self.wandb.Table(columns=["step", "prompt", "text"], data=list(self.samples))
            self.run.log({"samples": table}, step=int(record["step"]))

    def finish_run(self, step: int, verdict: Any, files: Sequence[Path]) -> None:
        """The verdict into the summary, the plots as images at the last step, report.md as a run file."""
        if self.run is None:
            return
        with self._guard():
            if verdict is not None:
                self.run.summary.update({"verdict/kind": verdict.kind, "verdict/reason": verdict.reason})
                self.run.summary["verdict/suggestion"] = verdict.suggestion
                self.run.summary["verdict/confidence"] = verdict.confidence_line()
            pngs = [p for p in files if p.suffix == ".png" and p.is_file()]
            if pngs:
                self.run.log({f"plots/{p.stem}": self.wandb.Image(str(p)) for p in pngs}, step=step)
            for path in files:
                if path.suffix == ".md" and path.is_file():
                    self.run.save(str(path), base_path=str(self.run_dir), policy="now")

    def close(self) -> None:
        if self.run is not None:
            with self._guard():
                self.run.finish()
        self.run = None

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """The first error W&B raises is one line, and W&B is left alone from then on (every method checks run)."""
        try:
            yield
        except Exception as error:  # whatever W&B raises, training goes on with its files (decided above)
            self.run = None
            self.warn(f"W&B failed ({type(error).__name__}: {error}); this run logs to its files only from here on")


def _run_id(run_dir: Path) -> str:
    """The id in RUN/wandb-id, or a new one written there (a resumed run continues the same W&B run)."""
    path = run_dir / ID_FILE
    if path.is_file():
        return path.read_text().strip()
    run_id = secrets.token_hex(6)  # W&B ids: letters and digits, unique within the project
    atomic_write_text(path, run_id + "\n")
    return run_id
