"""The loader's resumable state: a small JSON-ready dict of ints and strings.

It records the position in the global order (epoch, windows consumed by all ranks), not per-rank progress, so it is
the same on every rank and stays valid when the number of ranks changes. The remaining fields identify the order the
position refers to; resuming against a different one is refused instead of silently reading other data.
"""

from __future__ import annotations

from dlx.data.loader.order import Cursor, Order
from dlx.errors import UserError

STATE_FORMAT = "dlx-loader-state"
STATE_VERSION = 1


def make_state(order: Order, cursor: Cursor, split: str, seq_len: int) -> dict:
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "epoch": cursor.epoch,
        "consumed": cursor.consumed,
        "split": split,
        "seq_len": seq_len,
        "n_windows": order.n_windows,
        "seed": order.seed,
        "order": "shuffled" if order.shuffle else "sequential",
        # For the record only: a resume may use another world size or micro-batch size.
        "world_size": order.world_size,
        "micro_batch_size": order.micro_batch_size,
    }


def read_state(state: dict, order: Order, split: str, seq_len: int) -> Cursor:
    """The cursor a saved state resumes at; UserError when it was saved for other data or another order."""
    if state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
        raise UserError(
            f"loader state has format {state.get('format')!r} v{state.get('version')}, expected "
            f"{STATE_FORMAT!r} v{STATE_VERSION}"
        )
    expected = make_state(order, Cursor(0, 0), split, seq_len)
    for key in ("split", "seq_len", "n_windows", "seed", "order"):
        if state.get(key) != expected[key]:
            raise UserError(
                f"cannot resume the data loader: it was saved with {key}={state.get(key)!r}, this run has "
                f"{key}={expected[key]!r} (same dataset, seq_len, seed and shuffle are needed to continue exactly)"
            )
    epoch, consumed = int(state["epoch"]), int(state["consumed"])
    if epoch < 0 or not 0 <= consumed <= order.n_windows:
        raise UserError(f"loader state is damaged: epoch={epoch}, consumed={consumed} of {order.n_windows} windows")
    return Cursor(epoch, consumed)
