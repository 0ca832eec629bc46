"""`effectlog serve` as a real process: /healthz and /metrics over a socket, work done by its
loops (a crashed worker's effect gets settled), and a clean exit on SIGTERM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from consumers.providers.fake import FakeProvider
from effectlog.log import open_log
from effectlog.model import State
from effectlog.worker import Worker
from tests.kafka_broker import free_port
from tests.recovery_support import stop_serve, stuck

pytestmark = pytest.mark.timeout(120)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_for(predicate: object, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError("condition not reached in time")


def test_serve_settles_effects_exposes_metrics_and_stops_on_sigterm(tmp_path: Path) -> None:
    log_url = f"sqlite:///{tmp_path}/log.db"
    log = open_log(log_url)
    key = stuck(Worker(log, "crashed"), "srv-1", State.DISPATCHED)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "effectlog.cli.main", "--log", log_url, "--state",
         str(tmp_path / "state"), "serve", "--metrics-port", str(port), "--stuck-after", "1s",
         "--poll", "1s", "--provider", f"fake:///{tmp_path}/provider.db"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "serve.err").open("w"), env={**os.environ})
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _alive(base))
        status, body = get(base + "/healthz")
        health = json.loads(body)
        assert status == 200 and health["ok"] is True and health["projection"] is True
        assert health["log_end_offsets"] == {"0": 3}

        wait_for(lambda: Worker(log, "probe").get(key).state is State.SUCCEEDED)  # type: ignore[union-attr]
        assert FakeProvider(tmp_path / "provider.db").executions(key) == 1

        def metrics_show_the_work() -> bool:
            text = get(base + "/metrics")[1]
            return ('effectlog_reconciliations_total{action="dispatch"} 1.0' in text
                    and "effectlog_provider_effects_confirmed_total 1.0" in text
                    and "effectlog_projector_lag 0.0" in text)

        wait_for(metrics_show_the_work)
        text = get(base + "/metrics")[1]
        for name in ("effectlog_dispatch_attempts_total", "effectlog_unresolved_unknown",
                     "effectlog_rejected_events", "effectlog_recovery_commands_total"):
            assert name in text
        assert get(base + "/nowhere")[0] == 404
    finally:
        err = stop_serve(proc, tmp_path / "serve.err")
    assert proc.returncode == 0, err[-3000:]
    assert "stopped" in err
    with pytest.raises(OSError):
        urllib.request.urlopen(base + "/healthz", timeout=2)


def _alive(base: str) -> bool:
    try:
        return get(base + "/healthz")[0] in (200, 503)
    except OSError:
        return False
