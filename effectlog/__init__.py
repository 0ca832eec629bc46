"""effectlog: the truth about external side effects performed by workers.

The agent API is importable from here (``effectlog.Worker``, ``effectlog.AsyncWorker``,
``effectlog.effect``, ``effectlog.run``, ``effectlog.EffectInDoubt``); each name is imported
on first use, so ``import effectlog`` stays cheap (the CLI's fast paths rely on that).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "Worker": "effectlog.worker", "AsyncWorker": "effectlog.worker",
    "EffectInDoubt": "effectlog.worker", "effect": "effectlog.agent", "run": "effectlog.agent",
    "current_call": "effectlog.agent", "EffectAbandoned": "effectlog.agent",
}
__all__ = ["AsyncWorker", "EffectAbandoned", "EffectInDoubt", "Worker", "current_call", "effect", "run"]

if TYPE_CHECKING:
    from effectlog.agent import EffectAbandoned, current_call, effect, run
    from effectlog.worker import AsyncWorker, EffectInDoubt, Worker


def __getattr__(name: str) -> Any:
    if name == "__version__":  # from the installed package's metadata, on first use
        from importlib.metadata import version

        return version("effectlog")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'effectlog' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
