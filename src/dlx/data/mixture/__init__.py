"""Weighted mixtures of prepared datasets (`data.mix`): sources, the order of their windows, the loader.

`MixtureLoader` is imported on first use (PEP 562): worker processes import `order` and `plan` from this package and
must not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlx.data.mixture.loader import MixtureLoader

__all__ = ["MixtureLoader"]


def __getattr__(name: str) -> Any:
    if name != "MixtureLoader":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from dlx.data.mixture.loader import MixtureLoader

    return MixtureLoader
