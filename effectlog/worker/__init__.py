"""The worker API: one durable, checked event per transition, and a guarded provider call.

:class:`Worker` (threads) and :class:`AsyncWorker` (asyncio) are two shells around one
I/O-free core (:mod:`effectlog.worker.core`), so both judge every record the same way.
"""

from effectlog.worker.aio import AsyncEffectCall, AsyncWorker
from effectlog.worker.core import Appended, EffectInDoubt, LateVerdict, default_worker_id
from effectlog.worker.sync import EffectCall, Worker

__all__ = ["Appended", "AsyncEffectCall", "AsyncWorker", "EffectCall", "EffectInDoubt",
           "LateVerdict", "Worker", "default_worker_id"]
