"""A real worker process for the crash tests: one job through ``Worker.perform``.

``perform`` writes create, reserve and dispatch as one append; to pause between them
(``after_create``, ``after_reserve``) the job goes through the explicit step API instead,
one durable write per transition, as a worker written against that API does.

It can pause at one transition boundary (``--pause-at``): it prints a ``paused`` JSON line
and blocks on stdin, so the test can SIGKILL it there, or SIGSTOP/SIGCONT it and release it
with a newline. Its last stdout line is a ``done`` JSON line; the exit code says how the job
ended: 0 recorded (or the original result returned), 3 conflict (fenced, payload mismatch,
illegal transition), 4 log unavailable, 5 in doubt (left to recovery), 6 provider error
(the effect was marked UNKNOWN).

    python -m tests.crash.worker_main --log URL --provider fake:///p.db --op OP --kind K
        --target T --payload JSON [--worker-id W] [--pause-at POINT] [--server URL]

On Kafka (``--server``) its writes are judged by that ``effectlog serve``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from consumers.providers import load_provider
from effectlog.errors import BackendUnavailable, Conflict
from effectlog.log import open_log
from effectlog.model import EffectEvent, State
from effectlog.provider import Provider, ProviderError, ProviderFailed
from effectlog.worker import EffectCall, EffectInDoubt, Worker

POINTS = ("after_create", "after_reserve", "after_dispatch", "after_provider_call",
          "after_record")
STEP_POINTS = ("after_create", "after_reserve")  # only the explicit step API stops there


def say(**fields: Any) -> None:
    """One JSON line on stdout, flushed at once (the test reads it while we run)."""
    sys.stdout.write(json.dumps(fields, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


class PausingWorker(Worker):
    """A Worker that stops after one chosen transition until released on stdin."""

    pause_at: str | None = None

    def pause(self, point: str, event: EffectEvent) -> None:
        if point != self.pause_at:
            return
        say(event="paused", point=point, key=event.idempotency_key, state=event.state.value,
            epoch=event.fencing_epoch)
        sys.stdin.readline()  # SIGKILL lands here; or SIGSTOP, SIGCONT and a newline

    def create(self, operation_id: str, kind: str, target: str, payload: Any, *,
               payload_ref: str | None = None) -> EffectEvent:
        event = super().create(operation_id, kind, target, payload, payload_ref=payload_ref)
        self.pause("after_create", event)
        return event

    def reserve(self, key: str, *, epoch: int | None = None) -> EffectEvent:
        event = super().reserve(key, epoch=epoch)
        self.pause("after_reserve", event)
        return event

    def record(self, key: str, status: State | str, result: Any = None, *,
               source: str = "worker", epoch: int | None = None) -> EffectEvent:
        event = super().record(key, status, result, source=source, epoch=epoch)
        self.pause("after_record", event)
        return event


def chain(exc: BaseException) -> list[dict[str, str]]:
    """The exception and the ones it was raised while handling, outermost first."""
    out: list[dict[str, str]] = []
    seen: BaseException | None = exc
    while seen is not None and len(out) < 5:
        out.append({"type": type(seen).__name__, "reason": str(getattr(seen, "reason", "")),
                    "message": str(seen)[:300]})
        seen = seen.__cause__ or seen.__context__
    return out


def step_by_step(worker: PausingWorker, args: argparse.Namespace, payload: Any,
                 call_provider: Any) -> Any:
    """The job through the explicit API: create, reserve, dispatch, call, record."""
    current = worker.create(args.op, args.kind, args.target, payload)
    if current.state.terminal:
        return current.outcome.result if current.outcome else None
    if current.state not in (State.CREATED, State.RESERVED):
        raise EffectInDoubt(current)
    worker.reserve(current.idempotency_key)
    call = EffectCall(worker, worker.dispatch(current.idempotency_key), payload)
    try:
        result = call_provider(call)
    except ProviderFailed as exc:
        call.failed(exc.result)
        raise
    except BaseException as exc:
        worker.unknown(call.key, f"{type(exc).__name__}: {exc}"[:500])
        raise
    call.succeeded(result)
    return result


def run(worker: PausingWorker, provider: Provider, args: argparse.Namespace) -> int:
    payload = json.loads(args.payload)

    def call_provider(call: EffectCall) -> Any:
        worker.pause("after_dispatch", call.event)  # DISPATCHED is durable, nothing sent yet
        result = provider.execute(call.event.target, call.payload_hash, call.key,
                                  call.fencing_epoch, call.payload)
        worker.pause("after_provider_call", call.event)
        return result

    try:
        if worker.pause_at in STEP_POINTS:
            result = step_by_step(worker, args, payload, call_provider)
        else:
            result = worker.perform(args.op, args.kind, args.target, payload, call_provider)
    except ProviderFailed as exc:
        say(event="done", status="failed", result=exc.result)
        return 0
    except EffectInDoubt as exc:
        say(event="done", status="in_doubt", state=exc.event.state.value)
        return 5
    except Conflict as exc:
        say(event="done", status="conflict", errors=chain(exc))
        return 3
    except BackendUnavailable as exc:
        say(event="done", status="unavailable", errors=chain(exc))
        return 4
    except ProviderError as exc:
        say(event="done", status="provider_error", errors=chain(exc))
        return 6
    say(event="done", status="succeeded", result=result)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log", required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--op", required=True)
    parser.add_argument("--kind", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--payload", required=True, help="the job's payload as JSON")
    parser.add_argument("--worker-id", default=None)
    parser.add_argument("--pause-at", choices=POINTS, default=None)
    parser.add_argument("--server", default=None, help="the judge (a serve URL), on Kafka")
    parser.add_argument("--accept-timeout", type=float, default=30.0,
                        help="seconds a verdict is waited for (generous on a loaded machine)")
    args = parser.parse_args(argv)
    provider = load_provider(args.provider)
    try:
        log = open_log(args.log)
    except BackendUnavailable as exc:
        say(event="done", status="unavailable", errors=chain(exc))
        return 4
    worker = PausingWorker(log, args.worker_id, server=args.server,
                            accept_timeout_s=args.accept_timeout)
    worker.pause_at = args.pause_at
    try:
        return run(worker, provider, args)
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main())
