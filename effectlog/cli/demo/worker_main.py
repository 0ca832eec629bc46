"""An effectlog worker process of the demo: one job per stdin line, one reply line each.

Each job runs through :meth:`Worker.perform` with the job's stable key. The planned fault
of the delivery is applied here: a SIGKILL of this very process at a transition boundary
(no cleanup, no last write), or a provider answer that is lost (accept-then-timeout) or
late. The reply says whether the queue may drop the job (``ack``): everything but an
unreachable log is settled or handed over to recovery.

    python -m effectlog.cli.demo.worker_main --log URL --state DIR --provider SPEC --id W
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

from effectlog.codec import event_codec
from effectlog.errors import BackendUnavailable, Conflict
from effectlog.log import open_log
from effectlog.model import EffectEvent, State
from effectlog.provider import FencedByProvider, Provider, ProviderError, ProviderFailed, ProviderTimeout
from effectlog.worker import EffectCall, EffectInDoubt, Worker
from effectlog.worker.requests import Append, AppendAfter, Request


class CrashingWorker(Worker):
    """A Worker that kills its own process at the boundary named ``crash_at``."""

    crash_at: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Event ids of this delivery's appends that returned: durable, as the log promises.
        self.acknowledged: list[str] = []

    def _answer(self, request: Request[Any]) -> Any:
        """The shell's answer to the core, noting the events of every append that returned."""
        reply = super()._answer(request)
        if isinstance(request, Append | AppendAfter) and reply is not None:
            codec = event_codec()
            self.acknowledged.extend(str(codec.decode(data)["event_id"]) for data in request.data)
        return reply

    def crash_if(self, point: str) -> None:
        if point == self.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def record(self, key: str, status: State | str, result: Any = None, *,
               source: str = "worker", epoch: int | None = None) -> EffectEvent:
        event = super().record(key, status, result, source=source, epoch=epoch)
        self.crash_if("after_record")
        return event


def run_job(worker: CrashingWorker, provider: Provider, job: dict[str, Any]) -> dict[str, Any]:
    """Perform one delivery of a job; the reply for the queue (with the event ids the
    delivery appended durably, under ``events``)."""
    worker.acknowledged = []
    reply = _run_job(worker, provider, job)
    reply["events"] = worker.acknowledged
    return reply


def _run_job(worker: CrashingWorker, provider: Provider, job: dict[str, Any]) -> dict[str, Any]:
    worker.crash_at = job.get("crash")
    worker.crash_if("before_dispatch")  # the job was delivered; nothing is written yet

    def call(effect: EffectCall) -> Any:
        worker.crash_if("after_dispatch")  # DISPATCHED is durable; nothing is sent yet
        result = provider.execute(effect.event.target, effect.payload_hash, effect.key,
                                  effect.fencing_epoch, effect.payload)
        if job.get("slow_s"):
            time.sleep(float(job["slow_s"]))
        if job.get("timeout"):
            raise ProviderTimeout("injected: the provider performed the call, the answer was lost")
        worker.crash_if("after_provider_call")
        return result

    try:
        worker.perform(job["op"], job["kind"], job["target"], job["payload"], call)
    except ProviderFailed:
        return {"ack": True, "status": "failed"}
    except EffectInDoubt:
        return {"ack": True, "status": "in_doubt"}
    except Conflict as exc:  # another owner took the key over: this worker's write was refused
        refused = any(isinstance(e, FencedByProvider) for e in _chain(exc))
        return {"ack": True, "status": "superseded", "stale": True, "provider_refused": refused}
    except ProviderError as exc:  # marked UNKNOWN by the worker: recovery takes it from here
        refused = isinstance(exc, FencedByProvider)
        return {"ack": True, "status": "unknown", "provider_refused": refused}
    except BackendUnavailable as exc:
        return {"ack": False, "status": "error", "detail": str(exc)[:200]}
    return {"ack": True, "status": "succeeded"}


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(out) < 5:
        out.append(seen)
        seen = seen.__cause__ or seen.__context__
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="effectlog demo worker process")
    parser.add_argument("--log", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--server", default=None, help="the node's query API (Kafka)")
    args = parser.parse_args(argv)
    from consumers.providers import load_provider

    provider = load_provider(args.provider)
    log = open_log(args.log)
    worker = CrashingWorker(log, args.id, server=args.server)  # on Kafka, the node's judge
    for line in sys.stdin:
        reply = run_job(worker, provider, json.loads(line))
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
