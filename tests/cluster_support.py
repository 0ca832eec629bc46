"""Helpers of the cluster tests: `effectlog serve` processes and a workload appended meanwhile."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3

from consumers.providers.fake import FakeProvider
from effectlog.codec import event_codec
from effectlog.log import open_log
from effectlog.log.base import EVENTS
from effectlog.machine import advance, new_effect
from effectlog.model import Outcome, State
from effectlog.model import Transition as T
from tests.kafka_broker import free_port

HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=1, read=10))


def wait_until(condition: Callable[[], bool], within_s: float, what: str,
               explain: Callable[[], str] | None = None) -> float:
    """Seconds until ``condition()`` held; AssertionError after ``within_s`` (with what
    ``explain()`` tells of the state the wait ended in)."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > within_s:
            told = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"{what}: not within {within_s}s{told}")
        time.sleep(0.1)
    return time.monotonic() - start


def answer(url: str) -> tuple[int, Any]:
    """(status, JSON body) of a GET; status 0 when nothing answered."""
    try:
        response = HTTP.request("GET", url)
    except urllib3.exceptions.HTTPError:
        return 0, None
    try:
        return response.status, json.loads(response.data)
    except ValueError:
        return response.status, None


def ask_judge(url: str, keys: list[str], timeout_ms: int = 3000) -> tuple[int, Any]:
    """(status, JSON body) of ``POST /v1/judge`` asking about ``keys`` as they stand."""
    from effectlog.judge import worker_fingerprint

    body = json.dumps({"judge": worker_fingerprint(), "timeout_ms": timeout_ms,
                       "queries": [{"key": k} for k in keys]}).encode()
    try:
        response = HTTP.request("POST", url + "/v1/judge", body=body,
                                headers={"Content-Type": "application/json"})
    except urllib3.exceptions.HTTPError:
        return 0, None
    try:
        return response.status, json.loads(response.data)
    except ValueError:
        return response.status, None


def _recovery(provider: Path | None, extra: tuple[str, ...]) -> tuple[str, ...]:
    """``--provider`` for ``provider``; none when ``extra`` or the environment
    (EFFECTLOG_PROVIDER) names one; else ``--no-recovery`` (a member that only projects,
    judges and answers)."""
    if provider:
        return ("--provider", f"fake:///{provider}")
    named = "--provider" in extra or "--no-recovery" in extra or os.environ.get(
        "EFFECTLOG_PROVIDER")
    return () if named else ("--no-recovery",)


class Serve:
    """One `effectlog serve` process with its own state directory and port (recovering with
    the fake provider at ``provider``; without one, serving with ``--no-recovery``)."""

    def __init__(self, tmp: Path, name: str, log_url: str, provider: Path | None,
                 state_dir: Path | None = None, *extra: str) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.state_dir = state_dir or tmp / f"state-{name}"
        self.err_path = tmp / f"{name}.err"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "effectlog.cli.main", "--log", log_url, "--state",
             str(self.state_dir), "--log-level", "INFO", "serve", "--http",
             f"127.0.0.1:{self.port}", "--session-timeout", "6s", "--stuck-after", "2s",
             "--poll", "1s", "--command-timeout", "4s",
             *_recovery(provider, extra), *extra],
            stdout=subprocess.DEVNULL, stderr=self.err_path.open("w"), stdin=subprocess.DEVNULL)

    def health(self) -> dict[str, Any] | None:
        status, body = answer(self.url + "/healthz")
        return body if status in (200, 503) and isinstance(body, dict) else None

    def ready(self) -> tuple[int, dict[str, Any] | None]:
        """(status, body) of ``/readyz``; status 0 while nothing answers."""
        return answer(self.url + "/readyz")

    def serving(self) -> list[int]:
        health = self.health()
        if health is None:
            return []
        return sorted(int(p) for p, s in health["partitions"].items() if s == "serving")

    def tail(self, lines: int = 40) -> str:
        """The last ``lines`` of what the process logged."""
        try:
            return "\n".join(self.err_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.err_path.read_text()


class Workload(threading.Thread):
    """Appends effects as crashing workers would, until stopped (or ``limit`` effects, one
    every ``pause_s``): a third completed (the
    worker called the provider and recorded), a third left RESERVED (crashed before the
    call), a third left DISPATCHED after the provider performed it (crashed after)."""

    def __init__(self, log_url: str, provider: Path, pause_s: float = 0.15,
                 limit: int = 240) -> None:
        super().__init__(name="workload", daemon=True)
        self.log_url = log_url
        self.provider_path = provider
        self.pause_s = pause_s
        self.limit = limit
        self.keys: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        log = open_log(self.log_url)
        provider = FakeProvider(self.provider_path)
        codec = event_codec()
        try:
            i = 0
            while not self.stop.is_set() and i < self.limit:
                create = new_effect(f"op{i}", "email.send", f"mailto:u{i}@example.com",
                                    {"n": i}, "w1")
                reserve = advance(create, T.RESERVE, "w1")
                events = [create, reserve]
                if i % 3 != 1:
                    dispatch = advance(reserve, T.DISPATCH, "w1")
                    events.append(dispatch)
                key = create.idempotency_key
                log.append_many(EVENTS, [(key, codec.encode(e.to_record())) for e in events])
                if i % 3 != 1:
                    result = provider.execute(dispatch.target, dispatch.payload_hash, key,
                                              dispatch.fencing_epoch, {"n": i})
                if i % 3 == 0:
                    record = advance(dispatch, T.RECORD, "w1",
                                     outcome=Outcome(State.SUCCEEDED, result))
                    log.append(EVENTS, key, codec.encode(record.to_record()))
                self.keys.append(key)
                i += 1
                self.stop.wait(self.pause_s)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            provider.close()
            log.close()
