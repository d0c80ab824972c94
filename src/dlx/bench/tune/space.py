"""The layouts `dlx tune` chooses among: every combination of the recipe keys that change speed and memory but not
what is learned (strategy, tp, cp, activation checkpointing, micro-batch × accumulation at the recipe's global batch,
train.compile, train.float8, train.attention).

A strategy joins the search with one row of `STRATEGY_ROWS` (its name as in `parallel.strategy` and the variants of
its own keys, e.g. DeepSpeed's ZeRO stages); rows whose strategy the recipe does not know (`STRATEGY_TRAITS`) are
left out. Each layout is validated as a recipe (`build_config`), so what the recipe refuses is dropped with the
recipe's own message.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dlx.errors import UserError
from dlx.model.args import ModelArgs
from dlx.parallel.tensor import divisibility_problem
from dlx.parallel.traits import STRATEGY_TRAITS


@dataclass(frozen=True)
class StrategyRow:
    name: str
    """The `parallel.strategy` value."""
    variants: tuple[dict[str, Any], ...] = ({},)
    """The strategy's own `parallel` keys, one mapping per variant searched."""
    single_replica_only: bool = False
    """Only where there is one data-parallel replica (strategy none); the others only where there are several."""
    replica_groups: bool = False
    """One variant per parallel.dp_replicate that makes a 2-D mesh: a divisor of the data-parallel ranks strictly
    between 1 (which is fsdp) and all of them (which is replication alone) (strategy hsdp)."""

    def variants_at(self, dp: int) -> tuple[dict[str, Any], ...]:
        """The variants searched where there are `dp` data-parallel ranks."""
        if self.replica_groups:
            return tuple({"dp_replicate": d} for d in divisors_of(dp) if 1 < d < dp)
        return self.variants


STRATEGY_ROWS = (
    StrategyRow("none", single_replica_only=True),
    StrategyRow("ddp"),
    StrategyRow("fsdp"),
    StrategyRow("hsdp", replica_groups=True),
    StrategyRow("deepspeed", ({"zero_stage": 1}, {"zero_stage": 2}, {"zero_stage": 3})),
)
"""The strategies searched, in order of preference when predictions tie."""

CHECKPOINTING = ("none", "selective", "full")
ATTENTION_BY_DEVICE = {"cpu": ("default", "math"), "cuda": ("auto",)}
"""train.attention values searched per device: on CUDA `auto` already times SDPA's kernels at the run's shape."""
DIMENSION_KEYS = (
    "parallel.strategy",
    "parallel.tp",
    "parallel.cp",
    "parallel.activation_checkpointing",
    "data.micro_batch_size",
    "train.compile",
    "train.float8",
    "train.attention",
)
"""The recipe keys a layout sets; `--keep KEY` holds one at the recipe's value."""


@dataclass(frozen=True)
class Layout:
    strategy: str
    tp: int
    activation_checkpointing: str
    micro_batch: int
    grad_accum: int
    compile: bool
    float8: bool
    attention: str
    strategy_keys: tuple[tuple[str, Any], ...] = ()
    """The strategy row's variant (e.g. (("zero_stage", 2),))."""
    cp: int = 1
    """parallel.cp: context-parallel ranks per model replica, each holding seq_len / cp tokens of every sequence."""

    def tokens_per_micro(self, seq_len: int) -> int:
        """The tokens one rank's micro-batch holds: its sequences' seq_len / cp each."""
        return self.micro_batch * seq_len // self.cp

    @property
    def zero_stage(self) -> int:
        return int(dict(self.strategy_keys).get("zero_stage", 2))

    @property
    def dp_replicate(self) -> int:
        return int(dict(self.strategy_keys).get("dp_replicate", 1))

    def recipe_keys(self) -> dict[str, dict[str, Any]]:
        """The recipe keys this layout sets, by section."""
        parallel = {"strategy": self.strategy, "tp": self.tp, "cp": self.cp}
        parallel["activation_checkpointing"] = self.activation_checkpointing
        train = {"grad_accum": self.grad_accum, "compile": self.compile, "float8": self.float8}
        train["attention"] = self.attention
        return {
            "parallel": {**parallel, **dict(self.strategy_keys)},
            "data": {"micro_batch_size": self.micro_batch},
            "train": train,
        }

    def label(self) -> str:
        strategy = self.strategy + "".join(f" {key} {value}" for key, value in self.strategy_keys)
        flags = [name for name, on in (("compile", self.compile), ("float8", self.float8)) if on]
        context = f", cp {self.cp}" if self.cp > 1 else ""
        return (
            f"{strategy}, tp {self.tp}{context}, AC {self.activation_checkpointing}, micro {self.micro_batch} × accum "
            f"{self.grad_accum}, attn {self.attention}" + "".join(f", {flag}" for flag in flags)
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            **dict(self.strategy_keys),
            "tp": self.tp,
            "cp": self.cp,
            "activation_checkpointing": self.activation_checkpointing,
            "micro_batch_size": self.micro_batch,
            "grad_accum": self.grad_accum,
            "compile": self.compile,
            "float8": self.float8,
            "attention": self.attention,
        }


@dataclass(frozen=True)
class SearchSpace:
    """What the layouts range over, from the recipe, the world size and the device."""

    world_size: int
    global_batch: int
    """Sequences per optimizer step over all ranks (train.global_batch_size, else the recipe's micro-batch ×
    accumulation × data-parallel ranks at parallel.tp)."""
    tps: tuple[int, ...]
    cps: tuple[int, ...] = (1,)
    """parallel.cp values; one applies where it divides the data-parallel ranks and leaves replicas dividing the global
    batch."""
    checkpointing: tuple[str, ...] = CHECKPOINTING
    compile: tuple[bool, ...] = (False, True)
    float8: tuple[bool, ...] = (False,)
    attention: tuple[str, ...] = ("auto",)
    strategies: tuple[StrategyRow, ...] = field(default=STRATEGY_ROWS)
    kept_strategy: str | None = None
    """The one strategy `--keep parallel.strategy` holds: searched alone, also at one replica."""


def global_batch_of(raw: dict[str, Any], world_size: int) -> int:
    """train.global_batch_size, else data.micro_batch_size × train.grad_accum × the model replicas (world size ÷
    parallel.tp ÷ parallel.cp)."""
    train, data, parallel = (raw.get(name) or {} for name in ("train", "data", "parallel"))
    if train.get("global_batch_size"):
        return int(train["global_batch_size"])
    replicas = max(1, world_size // int(parallel.get("tp", 1)) // int(parallel.get("cp", 1)))
    return int(data.get("micro_batch_size", 8)) * int(train.get("grad_accum", 1)) * replicas


def tensor_parallel_sizes(
    args: ModelArgs, world_size: int, global_batch: int, cps: tuple[int, ...] = (1,)
) -> tuple[int, ...]:
    """Every tp that divides the world size and the model's dimensions and leaves, at one of the `cps`, a replica
    count dividing the global batch; a UserError when there is none (one line, naming why)."""
    divisors = [tp for tp in range(1, world_size + 1) if world_size % tp == 0]
    shaped = [tp for tp in divisors if divisibility_problem(args, tp) is None]

    def divides(tp: int) -> bool:
        dp = world_size // tp
        return any(dp % cp == 0 and global_batch % (dp // cp) == 0 for cp in cps)

    fitting = tuple(tp for tp in shaped if divides(tp))
    if not fitting:
        dps = ", ".join(str(world_size // tp) for tp in shaped)
        raise UserError(
            f"--world-size {world_size}: no layout divides it: the global batch of {global_batch} sequences is not a "
            f"multiple of any data-parallel rank count it allows ({dps}); pick a world size that divides "
            f"{global_batch}, or set train.global_batch_size to a multiple of {world_size}"
        )
    return fitting


def context_parallel_sizes(world_size: int, seq_len: int) -> tuple[int, ...]:
    """Every parallel.cp that divides the world size and splits seq_len into 2 × cp equal chunks (the load-balanced
    order); which of them a layout's tp leaves room for is `enumerate_layouts`'s."""
    return tuple(cp for cp in divisors_of(world_size) if seq_len % (2 * cp) == 0 or cp == 1)


def enumerate_layouts(space: SearchSpace) -> list[Layout]:
    """Every layout of the space, valid or not (the recipe validates them). The data-parallel ranks (world size ÷ tp)
    hold the context-parallel ones: a cp layout still needs a strategy that averages gradients over them."""
    layouts = []
    strategies = [row for row in space.strategies if row.name in STRATEGY_TRAITS]
    if space.kept_strategy is not None:
        strategies = [row for row in strategies if row.name == space.kept_strategy]
    for row, tp, cp in itertools.product(strategies, space.tps, space.cps):
        dp = space.world_size // tp
        if dp % cp or space.global_batch % (dp // cp):
            continue
        if row.single_replica_only and dp > 1:
            continue
        if dp == 1 and not row.single_replica_only and space.kept_strategy is None:
            continue  # one replica: nothing for a data-parallel strategy to do
        replicas = dp // cp
        for variant, checkpointing, micro, compile_on, float8, attention in itertools.product(
            row.variants_at(dp),
            space.checkpointing,
            divisors_of(space.global_batch // replicas),
            space.compile,
            space.float8,
            space.attention,
        ):
            accum = space.global_batch // (replicas * micro)
            keys = tuple(sorted(variant.items()))
            layouts.append(Layout(row.name, tp, checkpointing, micro, accum, compile_on, float8, attention, keys, cp))
    return layouts


def divisors_of(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layout_recipe(raw: dict[str, Any], layout: Layout) -> dict[str, Any]:
    """The recipe mapping with the layout's keys set (train.global_batch_size, when given, stays and agrees)."""
    merged = copy.deepcopy(raw)
    for section, keys in layout.recipe_keys().items():
        merged.setdefault(section, {})
        merged[section] = {**(merged[section] or {}), **keys}
    if merged["train"].get("global_batch_size"):
        del merged["train"]["grad_accum"]  # global_batch_size decides it, to the same value
    return merged


def keep_values(raw: dict[str, Any], keep: Iterable[str]) -> dict[str, Any]:
    """The recipe's values (defaults where unset) of the dimensions `--keep` holds fixed; a UserError for a key that is
    not a dimension."""
    defaults = {
        "parallel.strategy": "auto",
        "parallel.tp": 1,
        "parallel.cp": 1,
        "parallel.activation_checkpointing": "none",
        "data.micro_batch_size": 8,
        "train.compile": False,
        "train.float8": False,
        "train.attention": "auto",
    }
    kept = {}
    for key in keep:
        if key not in DIMENSION_KEYS:
            raise UserError(f"--keep {key}: not a searched key; choose from {', '.join(DIMENSION_KEYS)}")
        section, name = key.split(".")
        kept[key] = (raw.get(section) or {}).get(name, defaults[key])
    return kept
