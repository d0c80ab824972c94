"""The run folder: where it goes, what it holds, and which recipe keys may change when a run is resumed.

RUN_DIR/
    config.yaml        the resolved recipe (every default filled in, the model fully spelled out)
    tokenizer.json     the dataset's tokenizer, so `dlx generate RUN_DIR` needs nothing else
    metrics.jsonl      one record per logged step; eval.jsonl one per evaluation; events.jsonl (start, resume,
                       checkpoints, spikes, rollbacks, NaN, stop: each line with its wall-clock `time`)
    checkpoints/       step-00000100/ ... (see dlx.train.rundir.checkpoint)
    report.md          with loss.png and throughput.png, at the end of the run
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from typing import Any

import yaml

from dlx.errors import UserError
from dlx.train.rundir.runlock import LOCK_FILE

RUN_CONFIG_FILE = "config.yaml"
"""The resolved recipe a run folder holds (`dlx.train.recipe.write_resolved`)."""
RUNS_ROOT = Path("runs")
EVENTS_FILE = "events.jsonl"

RESUMABLE_CHANGES = {
    ("train", "max_steps"),
    ("train", "epochs"),
    ("train", "nan_policy"),
    ("train", "compile"),
    ("train", "attention"),
    ("train", "device"),
    ("data", "num_workers"),
    ("data", "prefetch"),
    ("data", "verify"),
    ("eval", "every"),
    ("eval", "batches"),
    ("checkpoint", "every"),
    ("checkpoint", "keep_last"),
    ("checkpoint", "async"),
    ("checkpoint", "full_weights"),
    ("log", "every"),
    ("log", "tensorboard"),
    ("log", "progress"),
    ("parallel", "strategy"),
    ("parallel", "activation_checkpointing"),
    ("parallel", "reshard_after_forward"),
    ("parallel", "timeout_s"),
    ("parallel", "tp"),
    ("parallel", "cp"),
    ("parallel", "cp_path"),
    ("parallel", "dp_replicate"),
    ("data", "micro_batch_size"),
    ("train", "grad_accum"),
    ("train", "global_batch_size"),
    ("eval", "sample_every"),
    ("eval", "sample_prompts"),
    ("eval", "sample_tokens"),
    ("eval", "sample_temperature"),
    ("eval", "sample_top_k"),
    ("eval", "sample_seed"),
    ("log", "nvml"),
    ("log", "wandb"),
    ("log", "wandb_project"),
    ("log", "wandb_name"),
    ("profile", "start"),
    ("profile", "steps"),
    ("profile", "with_stack"),
    ("profile", "top_ops"),
    ("profile", "memory_snapshot"),
    ("train", "decay_ratio"),
    ("train", "spike_policy"),
    ("train", "spike_sigma"),
    ("train", "spike_window"),
    ("train", "spike_patience"),
    ("train", "spike_rewarmup"),
    ("train", "spike_max_rollbacks"),
    ("data", "stages"),
}
"""Keys a resumed run may change: how long it runs, what it records (samples, profiles and W&B included), and how ranks
share it (a run may resume on another number of ranks with the batch split differently; the checkpoint says which
strategies can read it). With train.schedule wsd, a new length or decay_ratio re-plans the decay without a jump in
the lr (dlx.train.build.optim). data.stages may gain stages and the stage in progress may end elsewhere; the
checkpoint's record of the stages refuses a change to a stage that has begun (dlx.data.stages.check_saved_stages)."""


def new_run_dir(name: str, run_dir: Path | None) -> Path:
    """The folder for a fresh run: --run-dir, or runs/NAME-YYYYmmdd-HHMMSS. It must not hold a run already."""
    if run_dir is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = RUNS_ROOT / f"{name}-{stamp}"
        suffix = 1
        while run_dir.exists():
            suffix += 1
            run_dir = RUNS_ROOT / f"{name}-{stamp}-{suffix}"
    elif run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--run-dir {run_dir} is a file, not a folder; pick another --run-dir")
    elif run_dir.exists() and any(p.name != LOCK_FILE for p in run_dir.iterdir()):
        what = "holds a run" if (run_dir / RUN_CONFIG_FILE).is_file() else "is not empty"
        raise UserError(
            f"run folder {run_dir} already exists and {what}; add --resume to continue it, or pick another --run-dir"
        )
    return run_dir


def existing_run_dir(name: str, run_dir: Path | None) -> Path:
    """The folder to resume: --run-dir, or the newest runs/NAME-* folder."""
    if run_dir is None:
        candidates = sorted((p for p in RUNS_ROOT.glob(f"{name}-*") if (p / RUN_CONFIG_FILE).is_file()), key=_mtime)
        if not candidates:
            raise UserError(f"--resume: no earlier '{name}' run under {RUNS_ROOT}/; pass --run-dir RUN_DIR")
        return candidates[-1]
    check_holds_a_run(run_dir)
    return run_dir


def holds_a_run(run_dir: Path | None) -> bool:
    """--resume auto: whether --run-dir holds a run to continue (else a new run starts there)."""
    if run_dir is None:
        raise UserError(
            "--resume auto needs --run-dir DIR: the folder that every restart of the job starts or continues"
        )
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--resume auto: --run-dir {run_dir} is a file, not a folder; pass a folder")
    return (run_dir / RUN_CONFIG_FILE).is_file()


def check_holds_a_run(run_dir: Path) -> None:
    """--resume needs a folder that a run was started in; say which of the three it is not."""
    if not run_dir.exists():
        raise UserError(f"--resume: {run_dir} does not exist, so there is no run to resume; start one without --resume")
    if not run_dir.is_dir():
        raise UserError(f"--resume: {run_dir} is a file, not a run folder; pass the run's folder as --run-dir")
    if not (run_dir / RUN_CONFIG_FILE).is_file():
        raise UserError(
            f"--resume: {run_dir} holds no run ({RUN_CONFIG_FILE} is missing: no run was started there); start one "
            "without --resume, or pass the run's folder as --run-dir"
        )


def no_checkpoint_note(run_dir: Path) -> str:
    """What --resume says when the run folder has nothing to resume from: no checkpoint yet, or only damaged ones."""
    damaged = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*.damaged"))
    if damaged:
        return (
            f"--resume: {run_dir} has no complete checkpoint (damaged, set aside: {', '.join(damaged)}); "
            "starting the run again from step 0"
        )
    return (
        f"--resume: {run_dir} has no checkpoint yet (the run stopped before its first save); starting the run again "
        "from step 0"
    )


def _mtime(path: Path) -> float:
    return (path / RUN_CONFIG_FILE).stat().st_mtime


def saved_config(run_dir: Path) -> dict[str, Any]:
    check_holds_a_run(run_dir)
    try:
        data = yaml.safe_load((run_dir / RUN_CONFIG_FILE).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise UserError(
            f"cannot read {run_dir / RUN_CONFIG_FILE} ({type(e).__name__}); the run folder is damaged"
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"{run_dir / RUN_CONFIG_FILE} is damaged (not a mapping of sections)")
    return data


def check_resume_compatible(saved: dict[str, Any], resolved: dict[str, Any]) -> None:
    """A resumed run must be the same run: only RESUMABLE_CHANGES may differ from the saved config.yaml. A key the
    saved config does not hold (one added to dlx after the run started) may hold its default."""
    for section, values in resolved.items():
        before = saved.get(section) or {}
        for key, value in values.items():
            if (section, key) in RESUMABLE_CHANGES or before.get(key) == value:
                continue
            if key not in before and value == key_default(section, key):
                continue
            if (section, key) == ("model", "init_from") and value is None:  # the checkpoint holds the weights
                continue
            if isinstance(value, (list, tuple)) and list(value) == before.get(key):
                continue
            raise UserError(
                f"--resume: {section}.{key} is {value!r} but the run was started with {before.get(key)!r}; "
                f"resume with the same value (only {', '.join(sorted(f'{s}.{k}' for s, k in RESUMABLE_CHANGES))} "
                "may change)"
            )


def append_event(run_dir: Path, **fields: Any) -> None:
    """One line in events.jsonl: starts, resumes, checkpoints, fall-backs, skipped batches, stops, each with its
    wall-clock `time` (Unix seconds; `dlx view` puts events on the time axis and counts goodput from them). Small, rare,
    flushed at once."""
    fields.setdefault("time", round(time.time(), 3))
    with open(run_dir / EVENTS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(fields, default=str) + "\n")


def read_events(run_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The run's events.jsonl (of one `kind` when given), a line cut short by a crash left out."""
    events = []
    path = run_dir / EVENTS_FILE
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and (kind is None or event.get("event") == kind):
            events.append(event)
    return events


def key_default(section: str, key: str) -> Any:
    """The recipe key's default value, as a resolved config.yaml writes it."""
    from dlx.train.config import RunConfig

    field = RunConfig.model_fields.get(section)
    if field is None or field.default_factory is None:
        return None
    return field.default_factory().model_dump(mode="json").get(key)
