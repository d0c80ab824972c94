"""train.attention in a run: the kernel chosen once before step 1 (`choose_run_attention`, rank 0 decides), applied
on every rank for the whole run, training and the evaluation inside it (`AttentionObserver`), and stated in the
header.

SDPA's kernels are applied through the process-wide flags (`dlx.device.prefer_sdpa_kernel`), restored when the run
closes; flex through `Transformer.causal_kernel`. With data.document_mask on CUDA every training batch already runs
flex_attention with its document block mask (dlx.model.document_mask): `auto` then measures nothing, and a named
SDPA kernel only reaches the attention of generation (eval.sample_every). On a CPU masked batches run SDPA with a
boolean mask, under the same choice. The header says which applies.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch

from dlx.device import PRECISION_DTYPES, prefer_sdpa_kernel
from dlx.errors import UserError
from dlx.model.attention_kernels import AttentionChoice, AttentionShape, Timer, choose_attention, cpu_sdpa_kernel
from dlx.model.document_mask import uses_flex
from dlx.model.llama import Transformer
from dlx.parallel.distributed import DistEnv, main_decides
from dlx.train.config import RunConfig
from dlx.train.observers.base import Observer

DOCUMENT_MASK_LINE = (
    "attention: flex_attention with each batch's document block mask (data.document_mask); train.attention {setting} "
    "{applies}"
)


def attention_shape(config: RunConfig, micro_batch: int, tp: int, precision: str) -> AttentionShape:
    """One layer's attention call in a training step of this rank: its micro-batch, its share of the heads under
    tensor parallelism, the whole sequence, in the compute dtype."""
    args = config.model.args
    heads, kv_heads = args.n_heads // tp, args.kv_heads // tp
    return AttentionShape(micro_batch, heads, kv_heads, config.data.seq_len, args.head_dim, PRECISION_DTYPES[precision])


def choose_for_run(
    config: RunConfig, micro_batch: int, env: DistEnv, precision: str, device: torch.device
) -> AttentionChoice:
    """Rank 0 chooses train.attention at this rank's shape (timed before the model exists); every rank gets it."""
    shape = attention_shape(config, micro_batch, env.tp, precision)
    return main_decides(lambda: choose_run_attention(config, shape, device))


def choose_run_attention(
    config: RunConfig, shape: AttentionShape, device: torch.device, timer: Timer | None = None
) -> AttentionChoice:
    """train.attention for this run: measured or checked at the run's shape (`choose_attention`), a UserError for a
    kernel that cannot train here; under data.document_mask on CUDA nothing is measured (flex runs every batch), nor
    under context parallelism (its boolean mask leaves the choice to SDPA: efficient or math)."""
    setting = config.train.attention
    if setting == "flex" and device.type != "cuda":
        raise UserError(
            f"train.attention flex trains on CUDA only (flex_attention has no backward on {device.type} in torch "
            f"{torch.__version__.split('+')[0]}); set train.attention auto"
        )
    if config.data.document_mask and uses_flex(device) and setting in ("auto", "flex"):
        return AttentionChoice("flex" if setting == "flex" else None, setting, {}, shape)
    if setting == "auto" and (config.parallel.cp > 1 or config.parallel.cp_path):
        cpu_kernel = cpu_sdpa_kernel() if device.type == "cpu" else None
        return AttentionChoice(None, "auto under parallel.cp", {}, shape, cpu_kernel)
    return choose_attention(setting, shape, device, timer)


class AttentionObserver(Observer):
    """Holds the applied choice from the start of the run to `close` and states it in the header."""

    order = 0  # first: its header line beside the model's

    def __init__(self, choice: AttentionChoice, document_mask: bool, device: torch.device) -> None:
        self.choice, self.document_mask, self.device = choice, document_mask, device
        self._applied = ExitStack()

    def apply(self, model: Transformer) -> AttentionObserver:
        """Before step 1 (and before torch.compile traces the blocks, at their first call)."""
        model.use_attention(self.choice.kernel)
        self._applied.enter_context(prefer_sdpa_kernel(self.choice.kernel))
        return self

    def header(self) -> list[str]:
        if not self.document_mask:
            return [self.choice.header]
        if not uses_flex(self.device):
            return [f"{self.choice.header}; data.document_mask: SDPA with each batch's boolean mask, the same choice"]
        kernel = self.choice.kernel
        applies = (
            "has nothing to choose"
            if kernel is None
            else "is what runs"
            if kernel == "flex"
            else f"applies to generation only (eval.sample_every): {self.choice.header.removeprefix('attention: ')}"
        )
        return [DOCUMENT_MASK_LINE.format(setting=self.choice.setting, applies=applies)]

    def close(self) -> None:
        """SDPA's flags as they were before the run (a process may build another run, as the tests do)."""
        self._applied.close()
