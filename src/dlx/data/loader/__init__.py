"""The training data loader: packed token windows, a per-epoch order split across ranks, prefetch in worker processes.

`TokenLoader` is imported on first use (PEP 562): worker processes import this package for its numpy-only modules
(`order`, `windows`, `feed`) and must not pay for importing torch. A worker that dies or fails raises
`dlx.data.pool.WorkerError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlx.data.loader.loader import TokenLoader, document_ids, document_positions

__all__ = ["TokenLoader", "document_ids", "document_positions"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from dlx.data.loader import loader

    return getattr(loader, name)
