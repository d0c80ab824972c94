"""The recipe: typed, validated sections `model`, `data`, `train`, `eval`, `checkpoint`, `log`, `profile` and
`parallel` (declared in `dlx.parallel.config`).

Every field has a one-line docstring (listed by `dlx pretrain --keys`); a bad value fails on construction with a
message that names the key and what is allowed (`describe_error`). Cross-section rules live in `RunConfig`; what a
parallel strategy allows is read from its traits (`dlx.parallel.traits`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dlx.data import SYNTHETIC
from dlx.data.mixture.sources import check_mix, parse_mix
from dlx.data.stages import parse_until
from dlx.errors import UserError
from dlx.model.args import ROPE_TYPES, ModelArgs, RopeScaling
from dlx.model.presets import PRESETS, resolve_model_args
from dlx.parallel.config import ParallelConfig, sequence_problem
from dlx.parallel.traits import STRATEGY_TRAITS


class ResolvedInit(Protocol):
    """model.init_from as the recipe loader resolved it (`dlx.train.init.init_from.InitFrom`): the recipe takes its
    model shape from it."""

    @property
    def args(self) -> ModelArgs: ...


_STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False, validate_assignment=True)


class ModelSection(BaseModel):
    """A preset (or YAML/JSON file of ModelArgs) and any ModelArgs field on top of it, e.g. `dim: 512`."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    preset: str | None = "demo"
    """A preset name (`dlx params --list`) or a YAML/JSON file of ModelArgs; other keys here override its fields."""
    init_from: str | None = None
    """Start from these weights: a HF Llama folder, dlx model, checkpoint or run folder (the shape comes from them)."""
    pad_vocab_to: int = Field(64, ge=1, le=1 << 16)
    """init_from with data whose tokenizer extends the weights': the grown vocabulary is a multiple of this."""
    _args: ModelArgs | None = PrivateAttr(None)
    _init: ResolvedInit | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _resolve(self, info: ValidationInfo) -> ModelSection:
        overrides = dict(self.model_extra or {})
        problem = model_overrides_problem(overrides)
        if problem:
            raise ValueError(problem)
        init = (info.context or {}).get("init")
        if self.init_from and init is not None:
            self._init, self._args = init, init.args
            return self
        try:
            self._args = resolve_model_args(self.preset, **overrides)
        except UserError as e:
            raise ValueError(str(e)) from None
        return self

    @property
    def args(self) -> ModelArgs:
        """The model's shape: init_from's weights' (resolved by `dlx.train.recipe.load_recipe`), else the preset's
        with the overrides on top."""
        assert self._args is not None  # set by the validator
        return self._args

    @property
    def init(self) -> Any:
        """init_from as the recipe loader resolved it (`dlx.train.init.init_from.resolve_init`); None without one."""
        return self._init

    def resolved(self) -> dict[str, Any]:
        """The preset name, init_from and every ModelArgs field, as written into the run folder."""
        preset = None if self.init_from and "preset" not in self.model_fields_set else self.preset
        padding = {"pad_vocab_to": self.pad_vocab_to} if "pad_vocab_to" in self.model_fields_set else {}
        return {"preset": preset, "init_from": self.init_from, **padding, **self.args.model_dump(mode="json")}


def model_overrides_problem(overrides: dict[str, Any]) -> str | None:
    """What is wrong with the ModelArgs overrides of a model section (an unknown key, an infinite number), or None."""
    unknown = sorted(set(overrides) - set(ModelArgs.model_fields), key=str)
    if unknown:
        return (
            f"unknown key {f'model.{unknown[0]}'!r}; model takes 'preset', 'init_from', 'pad_vocab_to' and the "
            f"ModelArgs fields {', '.join(ModelArgs.model_fields)}"
        )
    infinite = [key for key, value in overrides.items() if isinstance(value, float) and not math.isfinite(value)]
    if infinite:  # ModelArgs takes inf for its `gt=0` floats; no model trains with them
        return f"model.{infinite[0]}: must be a finite number (got {overrides[infinite[0]]})"
    return None


class StageSection(BaseModel):
    """One stage of `data.stages`; a key left out carries over from the stage before (the first: data.*, model.*)."""

    model_config = _STRICT

    until: int | str | None = None
    """The stage's last step: a step, a token count of the run (40B), a share of max_steps (80%), or decay (WSD's)."""
    mix: dict[str, float] | None = None
    """{PATH: W, ...} read in this stage, as data.mix; left out: the previous stage's data."""
    seq_len: int | None = Field(None, gt=0, le=1 << 20)
    """Tokens per sequence in this stage, at equal tokens per step (fewer sequences per micro-batch or step)."""
    rope_theta: float | None = Field(None, gt=0)
    """model.rope_theta from this stage's first step on (not on the first stage: that is model.rope_theta)."""
    rope_scaling: RopeScaling | None = None
    """model.rope_scaling from this stage's first step on; null: plain RoPE (not on the first stage)."""

    @field_validator("until", mode="before")
    @classmethod
    def _parse_until(cls, value: Any) -> Any:
        if value is not None:
            parse_until(value)  # ValueError naming the syntax
        return value

    @field_validator("mix", mode="before")
    @classmethod
    def _parse_mix(cls, value: Any) -> Any:
        return DataSection._parse_mix(value)

    def sets_rope(self) -> bool:
        return bool({"rope_theta", "rope_scaling"} & self.model_fields_set)


class DataSection(BaseModel):
    model_config = _STRICT

    path: str = SYNTHETIC
    """A dataset folder written by `dlx prepare` (or its s3://, gs://, hf:// URL), or `synthetic`: generated tokens."""
    seq_len: int = Field(256, gt=0, le=1 << 20)
    """Tokens per training sequence (at most model.max_seq_len)."""
    micro_batch_size: int = Field(8, gt=0, le=1 << 16)
    """Sequences per forward/backward pass on each device."""
    num_workers: int = Field(1, ge=0, le=64)
    """Loader worker processes that read and batch shards ahead of the step (0: in the training process)."""
    prefetch: int = Field(4, gt=0, le=1024)
    """Batches the loader keeps ready ahead of the step."""
    shuffle: bool = True
    """Windows in a seeded random order each epoch; shard blocks for a bucket dataset over data.cache_gb."""
    mix: dict[str, float] | None = None
    """Datasets (folders or s3://, gs://, hf:// URLs) drawn by weight instead of data.path: {PATH: W, ...}, PATH=W,…"""
    document_mask: bool = False
    """Attention stays inside each document (ended by eos_id) and RoPE positions restart at each document's start."""
    verify: bool = True
    """Check each shard's SHA-256 the first time the loader maps it (in its workers); a mismatch stops the run."""
    cache_dir: str = ""
    """Local folder for datasets in object storage (s3://, gs://, hf://); empty: ~/.cache/dlx/datasets."""
    cache_gb: float = Field(50.0, gt=0)
    """GB of shards kept in cache_dir per split and rank from object storage (shared by a data.mix's URL sources)."""
    cache_downloads: int = Field(4, ge=1, le=64)
    """Shards of a dataset in object storage downloaded at once, in the order the coming batches read them."""
    stages: list[StageSection] | None = Field(None, min_length=1, max_length=64)
    """Stages in order, each {until, mix, seq_len, rope_theta, rope_scaling}; the last runs to train.max_steps."""

    @field_validator("mix", mode="before")
    @classmethod
    def _parse_mix(cls, value: Any) -> Any:
        """Weights are checked as written, before pydantic would turn `true` or "2" into a number."""
        mix = parse_mix(value) if isinstance(value, str) else value
        if isinstance(mix, dict):
            check_mix(mix)
        return mix

    @model_validator(mode="after")
    def _mix_or_path(self) -> DataSection:
        if self.mix is not None and "path" in self.model_fields_set:
            raise ValueError("data.mix and data.path are exclusive: list every dataset with its weight in data.mix")
        for index, stage in enumerate(self.stages or []):
            last = index == len(self.stages) - 1
            if last and stage.until is not None:
                raise ValueError(f"data.stages[{index}].until: the last stage runs to train.max_steps; leave it out")
            if not last and stage.until is None:
                raise ValueError(f"data.stages[{index}].until is missing: every stage but the last says where it ends")
            if index == 0 and stage.sets_rope():
                raise ValueError(
                    "data.stages[0]: the first stage's RoPE is the model's; set model.rope_theta or model.rope_scaling"
                )
            if stage.mix is not None and self.path == SYNTHETIC and self.mix is None:
                raise ValueError(f"data.stages[{index}].mix: synthetic data has no datasets; set data.mix or data.path")
        return self

    def stage_seq_lens(self) -> list[int]:
        """Each stage's seq_len, carried over (one entry, data.seq_len, without stages)."""
        lengths = [self.seq_len]
        for stage in self.stages or []:
            lengths.append(stage.seq_len or lengths[-1])
        return lengths[1:] if self.stages else lengths


class TrainSection(BaseModel):
    model_config = _STRICT

    max_steps: int | None = Field(None, gt=0)
    """Optimizer steps to run; when set it overrides `epochs` (as in HF Trainer)."""
    epochs: float = Field(1.0, gt=0, le=1e6)
    """Passes over the training split, used when max_steps is not set (needs a prepared dataset)."""
    grad_accum: int = Field(1, gt=0, le=1 << 16)
    """Micro-batches whose gradients add up to one optimizer step (on each rank)."""
    global_batch_size: int | None = Field(None, gt=0, le=1 << 30)
    """Sequences per optimizer step over all ranks; when set, grad_accum = it / (micro_batch_size × world size)."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """adamw (fused where available), or plain sgd (no momentum; for exact comparisons across layouts)."""
    lr: float = Field(3e-4, gt=0, le=10)
    """Peak learning rate, reached at the end of warm-up."""
    min_lr: float = Field(3e-5, ge=0, le=10)
    """Learning rate at the end of the decay (cosine, linear or wsd; at most lr)."""
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    """Share of the optimizer steps spent warming the learning rate up linearly from 0."""
    schedule: Literal["cosine", "linear", "constant", "wsd"] = "cosine"
    """Decay from lr to min_lr after warm-up; wsd: hold lr, then decay over the last train.decay_ratio of steps."""
    decay_ratio: float = Field(0.2, ge=0, le=1)
    """wsd: share of the optimizer steps in the final decay to min_lr (0: no decay)."""
    decay_shape: Literal["linear", "cosine", "1-sqrt"] = "1-sqrt"
    """wsd: shape of the final decay (1-sqrt: lr falls as 1 - sqrt(progress))."""
    z_loss: float = Field(0.0, ge=0, le=1)
    """Weight of the z-loss, mean squared log-partition of the logits (OLMo, PaLM use 1e-4 to 1e-5); 0: off."""
    weight_decay: float = Field(0.1, ge=0, le=10)
    """AdamW decoupled weight decay for matmul weights (norms and the embedding are not decayed)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW beta1 and beta2, each in [0, 1)."""
    eps: float = Field(1e-8, gt=0, le=1)
    """AdamW epsilon."""
    grad_clip: float = Field(1.0, ge=0)
    """Clip the global gradient norm to this value; 0 turns clipping off (the norm is still logged)."""
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    """Compute precision; auto: bf16 where the device runs it natively (CUDA, CPUs with AMX/AVX512-BF16), else fp32."""
    device: str = "auto"
    """`auto` (CUDA when available, else CPU), `cpu`, `cuda` or `cuda:N`."""
    seed: int = Field(0, ge=0, lt=2**63)
    """Seeds the weights, the data order and every random generator."""
    compile: bool = False
    """Wrap the model in torch.compile (needs a C++ compiler on CPU); compiled code is cached per model and shape."""
    attention: Literal["auto", "default", "cudnn", "flash", "efficient", "math", "flex"] = "auto"
    """Attention kernel: auto (the fastest, timed on CUDA), default (PyTorch's), cudnn, flash, efficient, math, flex."""
    float8: bool = False
    """Blocks' linear layers compute in float8 through torchao (dlx[float8]; bf16; CUDA ≥ 8.9, or CPU: slow)."""
    float8_recipe: Literal["tensorwise", "rowwise"] = "tensorwise"
    """train.float8's scaling: one factor per tensor (faster) or per row (more accurate); torchao's recipes."""
    nan_policy: Literal["stop", "skip"] = "stop"
    """On a NaN/inf loss: `stop` (naming the step and the last good checkpoint) or `skip` the batch's update."""
    skip_memory_check: bool = False
    """Start even when `dlx plan`'s memory estimate for this layout exceeds the device's free memory."""
    spike_policy: Literal["off", "skip", "rollback"] = "off"
    """On a loss spike: `skip` its update, or `rollback` after spike_patience in a row (train/observers/spikes.py)."""
    spike_sigma: float = Field(6.0, gt=0, le=1e3)
    """A spike: a loss above the mean of the last spike_window accepted losses by this many standard deviations."""
    spike_window: int = Field(100, ge=2, le=1 << 20)
    """Accepted losses the spike test compares with; no judgement before the window is full."""
    spike_patience: int = Field(3, ge=1, le=1 << 20)
    """rollback: consecutive spikes that reload the newest checkpoint older than the first of them."""
    spike_max_rollbacks: int = Field(5, ge=0, le=1 << 20)
    """rollback: rollbacks a run may take; at the next one it stops with one line (a run that keeps spiking)."""
    spike_rewarmup: int = Field(0, ge=0, le=1 << 20)
    """rollback: steps after it over which the learning rate rises linearly back to the schedule's; 0: none."""

    @model_validator(mode="after")
    def _check(self) -> TrainSection:
        if self.min_lr > self.lr:
            raise ValueError(f"train.min_lr ({self.min_lr}) must be at most train.lr ({self.lr})")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"train.betas {list(self.betas)} must each be in [0, 1), e.g. [0.9, 0.95]")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"train.device '{self.device}' must be auto, cpu, cuda or cuda:N")
        return self


class EvalSection(BaseModel):
    model_config = _STRICT

    every: int = Field(0, ge=0)
    """Evaluate on the validation split every this many optimizer steps (and at the end); 0 turns eval off."""
    batches: int = Field(20, gt=0, le=1 << 20)
    """Micro-batches per evaluation (fewer if the validation split is smaller)."""
    # Samples during training (dlx.train.observers.sample), through the code `dlx generate` runs.
    sample_every: int = Field(0, ge=0)
    """Continue each of eval.sample_prompts every this many optimizer steps, printed and in samples.jsonl; 0: off."""
    sample_prompts: list[str] = Field(default_factory=list, max_length=64)
    """Prompts to continue with the dataset's tokenizer (needed when eval.sample_every > 0)."""
    sample_tokens: int = Field(64, gt=0, le=1 << 16)
    """Tokens generated after each prompt (fewer at model.max_seq_len or the end-of-document token)."""
    sample_temperature: float = Field(0.8, ge=0, le=100)
    """0: greedy decoding; above 0: sampling at this temperature, seeded by eval.sample_seed (as `dlx generate`)."""
    sample_top_k: int | None = Field(50, gt=0)
    """Sample among the k likeliest tokens (null: among all) when eval.sample_temperature > 0."""
    sample_seed: int = Field(0, ge=0, lt=2**63)
    """Seed of the sampler's own generator, the same at every sampling step; training's random state is untouched."""
    # Downstream tasks through lm-evaluation-harness on the live model (dlx.train.observers.tasks; needs dlx[eval]).
    tasks: list[str] = Field(default_factory=list, max_length=256)
    """lm-eval task names or task YAML paths (dlx ships dlx_stdlib_next_line); results in tasks.jsonl."""
    task_dir: str | None = None
    """A folder of local lm-eval task YAML files (data from local files) whose tasks eval.tasks may name."""
    tasks_every: int = Field(0, ge=0)
    """Run eval.tasks every this many optimizer steps and at the end; 0: only at the end of the run."""
    tasks_limit: int | None = Field(None, gt=0)
    """Documents per task at most (each task's first ones); null: all of them."""

    @model_validator(mode="after")
    def _check_samples(self) -> EvalSection:
        if self.sample_every and not self.sample_prompts:
            raise ValueError(
                f"eval.sample_every is {self.sample_every} but eval.sample_prompts is empty; give prompts, "
                "e.g. --eval.sample_prompts '[\"def \"]', or set eval.sample_every 0"
            )
        if self.tasks_every and not self.tasks:
            raise ValueError(
                f"eval.tasks_every is {self.tasks_every} but eval.tasks is empty; name tasks, e.g. "
                "--eval.tasks '[\"dlx_stdlib_next_line\"]', or set eval.tasks_every 0"
            )
        empty = [i for i, prompt in enumerate(self.sample_prompts) if not prompt]
        if empty:
            raise ValueError(f"eval.sample_prompts[{empty[0]}] is an empty string; give some text to continue")
        return self


class CheckpointSection(BaseModel):
    model_config = ConfigDict(**_STRICT, validate_by_name=True, validate_by_alias=True)

    every: int = Field(0, ge=0)
    """Save a checkpoint every this many optimizer steps; 0: only at the end (and on an orderly stop)."""
    keep_last: int = Field(3, gt=0, le=1 << 20)
    """Complete checkpoints to keep; older ones are deleted after each successful save."""
    async_save: bool = Field(False, alias="async")
    """Sharded (DCP) checkpoints: written in the background by a writer process at nice 19; counted once complete."""
    full_weights: Literal["every", "last", "never"] = "last"
    """Sharded checkpoints: gather model.safetensors into every checkpoint, only the run's last one, or never."""


class LogSection(BaseModel):
    model_config = _STRICT

    every: int = Field(10, gt=0)
    """Write a metrics record (metrics.jsonl, console line) every this many optimizer steps."""
    tensorboard: bool = False
    """Also write TensorBoard event files into the run folder (needs `pip install tensorboard`)."""
    progress: bool = True
    """Show a progress bar with loss, tokens/s, MFU and ETA (only on a terminal)."""
    # GPU counters and Weights & Biases (dlx.metrics.gpu_monitor, dlx.metrics.wandb_sink).
    nvml: bool = True
    """On CUDA, GPU and memory-controller utilisation (and on Hopper+ tensor/DRAM activity) per record via NVML."""
    wandb: bool = False
    """Also log to Weights & Biases from rank 0 (dlx[wandb]); refused before step 1 without it or credentials."""
    wandb_project: str = Field("dlx", min_length=1, max_length=128)
    """The W&B project the run is logged to."""
    wandb_name: str | None = Field(None, min_length=1, max_length=128)
    """The W&B run's display name; null: the run folder's name."""


class ProfileSection(BaseModel):
    model_config = _STRICT

    start: int = Field(3, gt=0)
    """First optimizer step that torch.profiler records (after warm-up steps, whose timings are not typical)."""
    steps: int = Field(0, ge=0, le=1000)
    """Optimizer steps to record from profile.start, a trace per rank in RUN/profile/; 0: the profiler is off."""
    with_stack: bool = True
    """Record the Python stack of every op in the trace: which line ran it (on the demo: a 26 % larger trace)."""
    top_ops: int = Field(15, gt=0, le=1000)
    """Rows of the table of ops by self time (console, report.md and RUN/profile/)."""
    memory_snapshot: bool = True
    """On CUDA, also record the allocator's history over the profiled steps: snapshot, timeline and flame graph."""


SECTIONS = ("model", "data", "train", "eval", "checkpoint", "log", "parallel", "profile")


class RunConfig(BaseModel):
    """A whole recipe. Sections left out take their defaults."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: ModelSection = Field(default_factory=ModelSection)
    """The model shape."""
    data: DataSection = Field(default_factory=DataSection)
    """Where the tokens come from and how they are batched."""
    train: TrainSection = Field(default_factory=TrainSection)
    """Optimizer, schedule, precision and run length."""
    eval: EvalSection = Field(default_factory=EvalSection)
    """Validation loss and perplexity."""
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    """When to save and how many to keep."""
    log: LogSection = Field(default_factory=LogSection)
    """Metrics records, console lines, progress bar, TensorBoard."""
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    """How the ranks under torchrun share the work (DDP, FSDP2, DeepSpeed), activation checkpointing."""
    profile: ProfileSection = Field(default_factory=ProfileSection)
    """torch.profiler around chosen optimizer steps: traces, the top ops by self time, CUDA memory snapshots."""

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        args = self.model.args
        for key, seq_len in self._seq_len_keys():
            if seq_len > args.max_seq_len:
                raise ValueError(
                    f"{key} ({seq_len}) exceeds model.max_seq_len ({args.max_seq_len}); "
                    f"lower {key} or raise model.max_seq_len"
                )
        if self.data.path == SYNTHETIC and not self.data.mix and self.train.max_steps is None:
            raise ValueError("synthetic data has no epochs: set train.max_steps (or data.path to a prepared dataset)")
        self._check_stages()
        self._check_parallel()
        self._check_observers()
        return self

    def _check_parallel(self) -> None:
        train, strategy = self.train, STRATEGY_TRAITS[self.parallel.strategy]
        if not strategy.skips_nan_steps and train.nan_policy == "skip":
            raise ValueError(f"train.nan_policy skip is not available with parallel.strategy {strategy.name}; use stop")
        if not strategy.trains_fp16 and train.precision == "fp16":
            raise ValueError(
                f"parallel.strategy {strategy.name} trains in bf16 or fp32; set train.precision bf16 (or fp32)"
            )
        if train.float8 and (train.precision in ("fp16", "fp32") or not strategy.runs_float8 or self.parallel.tp > 1):
            raise ValueError(
                "train.float8 runs with train.precision bf16 (or auto), parallel.strategy none, ddp or fsdp and "
                "parallel.tp 1; set train.float8 false or change those"
            )
        if not strategy.skips_nan_steps and train.spike_policy != "off":
            raise ValueError(f"train.spike_policy is not available with parallel.strategy {strategy.name}; use off")
        parallel = self.parallel
        for key, seq_len in self._seq_len_keys():
            problem = sequence_problem(parallel.cp, parallel.cp_path, seq_len, train.attention, self.data.document_mask)
            if problem:
                raise ValueError(problem if key == "data.seq_len" else f"{key}: {problem}")
        self._check_tensor_parallel()

    def _check_tensor_parallel(self) -> None:
        tp, strategy = self.parallel.tp, self.parallel.strategy
        if tp == 1:
            return
        if not STRATEGY_TRAITS[strategy].supports_tp:
            raise ValueError(
                f"parallel.strategy {strategy} does not combine with parallel.tp {tp} (it does not take "
                "tensor-parallel parameters); use parallel.strategy fsdp for FSDP × TP, or parallel.tp 1"
            )
        from dlx.parallel.tensor import divisibility_problem  # torch: loaded once a recipe asks for tp > 1

        problem = divisibility_problem(self.model.args, tp)
        if problem:
            raise ValueError(problem)
        cp = self.parallel.cp
        for key, seq_len in self._seq_len_keys():
            if seq_len % (tp * cp):
                of = f"parallel.tp ({tp})" if cp == 1 else f"parallel.tp × parallel.cp ({tp * cp})"
                raise ValueError(
                    f"{key} ({seq_len}) must be a multiple of {of}: sequence parallelism gives each "
                    "tensor-parallel rank seq_len / cp / tp tokens of every sequence"
                )
        if self.train.precision == "fp16":
            raise ValueError(f"parallel.tp {tp} trains in bf16 or fp32; set train.precision bf16 (or fp32)")
        if self.eval.sample_every:
            raise ValueError(
                f"eval.sample_every does not combine with parallel.tp {tp} (generation runs on a whole model); set "
                "eval.sample_every 0 and generate from a checkpoint with dlx generate"
            )
        if self.train.z_loss:
            raise ValueError(
                f"train.z_loss does not combine with parallel.tp {tp} yet (the z-loss is computed on whole logits, "
                "which tensor parallelism never gathers); set train.z_loss 0"
            )

    def _seq_len_keys(self) -> list[tuple[str, int]]:
        """(key, seq_len) of data.seq_len and of every stage that sets its own."""
        stages = self.data.stages or []
        own = [(f"data.stages[{i}].seq_len", s.seq_len) for i, s in enumerate(stages) if s.seq_len is not None]
        return [("data.seq_len", self.data.seq_len), *own]

    def _check_stages(self) -> None:
        """data.stages: a run length in steps, and each stage's RoPE a valid model shape."""
        if not self.data.stages:
            return
        if self.train.max_steps is None:
            raise ValueError("data.stages needs train.max_steps: a stage's end is a step of the run")
        for index, rope in enumerate(self.stage_ropes()):
            try:
                ModelArgs.model_validate({**self.model.args.model_dump(), **rope})
            except ValidationError as e:
                raise ValueError(f"data.stages[{index}]: {describe_error(e)}") from None

    def stage_ropes(self) -> list[dict[str, Any]]:
        """Each stage's {rope_theta, rope_scaling} in force, carried over from model.* (empty without stages)."""
        args = self.model.args
        rope = {"rope_theta": args.rope_theta, "rope_scaling": args.model_dump(mode="json")["rope_scaling"]}
        ropes = []
        for stage in self.data.stages or []:
            rope = {**rope, **stage.model_dump(mode="json", include={"rope_theta", "rope_scaling"}, exclude_unset=True)}
            ropes.append(rope)
        return ropes

    def _check_observers(self) -> None:
        no_tokenizer = self.data.path == SYNTHETIC and not self.data.mix and not self.model.init_from
        for key, value in (("sample_every", self.eval.sample_every), ("tasks", self.eval.tasks)):
            if value and no_tokenizer:
                raise ValueError(
                    f"eval.{key} needs a tokenizer and synthetic data has none; set data.path to a prepared "
                    f"dataset (or model.init_from to weights with their tokenizer) or turn eval.{key} off"
                )
        last = self.profile.start + self.profile.steps - 1
        if self.profile.steps and self.train.max_steps is not None and last > self.train.max_steps:
            raise ValueError(
                f"profile.start {self.profile.start} + profile.steps {self.profile.steps} run past "
                f"train.max_steps {self.train.max_steps}; profile steps {self.profile.start}..{last} must exist"
            )

    def resolved(self) -> dict[str, Any]:
        """Every section with defaults filled in and the model fully resolved, as written into the run folder."""
        out = self.model_dump(mode="json", by_alias=True)
        out["model"] = self.model.resolved()
        if self.data.mix is not None:  # data.path is not used: leave it out, so the file loads back as a recipe
            del out["data"]["path"]
        if self.data.stages is not None:  # a key left out carries over; null rope_scaling turns the scaling off
            out["data"]["stages"] = [s.model_dump(mode="json", exclude_unset=True) for s in self.data.stages]
        return out


def describe_error(error: ValidationError) -> str:
    """One line: the dotted recipe key, what is wrong and what is allowed."""
    first = error.errors()[0]
    key = dotted_key(first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        section = str(first["loc"][0]) if len(first["loc"]) > 1 else ""
        if first["loc"][1:2] == ("stages",):
            return f"unknown key {key!r}; a stage takes {', '.join(StageSection.model_fields)}"
        return f"unknown key {key!r}; {_allowed_keys(section)}"
    if first["type"] == "value_error":  # our own validators: the message already names the keys
        return message if not key or message.startswith((f"{key}.", "unknown key")) else f"{key}: {message}"
    return f"{key}: {message[0].lower()}{message[1:]} (got {first.get('input')!r})"


def dotted_key(loc: tuple[int | str, ...]) -> str:
    """pydantic's location as a recipe key: `data.stages[1].rope_scaling.factor` (a list index in brackets, the
    rope_scaling kind's tag left out)."""
    key = ""
    for index, part in enumerate(loc):
        if isinstance(part, int):
            key += f"[{part}]"
        elif not (index and loc[index - 1] == "rope_scaling" and part in ROPE_TYPES):
            key += f".{part}" if key else str(part)
    return key


def _allowed_keys(section: str) -> str:
    if not section:
        return f"the sections are {', '.join(SECTIONS)}"
    if section == "model":
        return f"model takes preset ({', '.join(PRESETS)}), init_from, pad_vocab_to and the ModelArgs fields"
    fields = RunConfig.model_fields[section].annotation.model_fields  # type: ignore[union-attr]
    return f"{section} keys are {', '.join(info.alias or key for key, info in fields.items())}"


def build_config(raw: dict[str, Any], init: ResolvedInit | None = None, world_size: int | None = None) -> RunConfig:
    """Validate a recipe mapping into a RunConfig, or raise UserError with one line. Reads no file: `init` is
    model.init_from resolved by the recipe loader (its weights and the run's model shape); without it the model's
    shape comes from the preset and the `model.*` keys (as in a run folder's config.yaml, which spells every field).
    `world_size`: the ranks parallel.strategy auto plans for (default: the launcher's WORLD_SIZE, else 1)."""
    try:
        return RunConfig.model_validate(raw, context={"init": init, "world_size": world_size})
    except ValidationError as e:
        # One line even when the message quotes a value that holds a line break.
        raise UserError(f"recipe: {describe_error(e)}".replace("\n", "\\n")) from None


def describe_keys() -> list[str]:
    """Every recipe key with its default and one-line meaning, section by section (for `dlx pretrain --keys`)."""
    lines = []
    for section in SECTIONS:
        lines.append(f"{section}:")
        model_cls = RunConfig.model_fields[section].annotation
        for key, info in model_cls.model_fields.items():  # type: ignore[union-attr]
            default = info.get_default(call_default_factory=True)
            lines.append(f"  {info.alias or key}: {json.dumps(default)}  # {info.description or ''}")
            if (section, key) == ("data", "stages"):
                lines += [f"  stages[].{k}: null  # {i.description}" for k, i in StageSection.model_fields.items()]
        if section == "model":
            lines.append("  <any ModelArgs field>: overrides the preset  # see `dlx params --json` for the fields")
    return lines
