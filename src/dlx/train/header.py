"""The start-up header a run prints before step 1 (and repeats in report.md): the step plan, the model and device,
the meter's conventions, what preflight checked, the observers' lines, where the initial weights came from, float8,
and why validation has no bits per byte when it has none."""

from __future__ import annotations

import torch

from dlx.metrics.meter import ThroughputMeter
from dlx.parallel.float8 import float8_header
from dlx.parallel.strategy import Strategy
from dlx.train.config import RunConfig
from dlx.train.data import DatasetInfo
from dlx.train.init_from import InitSource, describe_changes
from dlx.train.observe import bpb_note
from dlx.train.observer import ObserverList
from dlx.train.preflight import Preflight
from dlx.train.step_plan import StepPlan, header_lines


def build_header(
    config: RunConfig,
    plan: StepPlan,
    strategy: Strategy,
    device: torch.device,
    meter: ThroughputMeter,
    preflight: Preflight | None,
    observers: ObserverList,
    init: InitSource | None,
    data_info: DatasetInfo,
) -> list[str]:
    """Every line of the header, in the order printed."""
    from dlx.device import device_name

    # ds_numel: a ZeRO-3 parameter's full size (its local tensor is empty); a DTensor's numel is already the full one
    trainable = sum(getattr(p, "ds_numel", p.numel()) for p in strategy.model.parameters() if p.requires_grad)
    header = header_lines(plan, trainable, strategy.precision.name, device_name(device)) + meter.header()
    header += preflight.lines() if preflight else []
    header += observers.header()
    if init is not None:
        header.append(f"initial weights: {init.describe()}")
        changes = describe_changes(init.args(), strategy.model.args)
        if changes:
            header.append(f"changed at init_from: {', '.join(changes)}")
    if config.train.float8:
        header += float8_header(strategy.model, config.train.float8_recipe, device)
    return header + bpb_note(config, data_info)
