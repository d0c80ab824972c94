"""The training data loader: packed token windows, a per-epoch order split across ranks, prefetch in worker processes.

`TokenLoader` is imported on first use (PEP 562): worker processes import this package for its numpy-only modules and
must not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlx.data.loader.documents import document_ids, document_positions
    from dlx.data.loader.loader import TokenLoader
    from dlx.data.loader.pool import LoaderWorkerError

__all__ = ["LoaderWorkerError", "TokenLoader", "document_ids", "document_positions"]

_HOMES = {
    "TokenLoader": "dlx.data.loader.loader",
    "LoaderWorkerError": "dlx.data.loader.pool",
    "document_positions": "dlx.data.loader.documents",
    "document_ids": "dlx.data.loader.documents",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HOMES[name]), name)
