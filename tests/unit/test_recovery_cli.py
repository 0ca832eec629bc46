"""The worked example of docs/concepts/recovery.md through the real CLI: crashed worker ->
recover -> reconcile -> history; and `fake-provider serve` over a real socket."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from consumers.providers.http import HttpProvider
from effectlog.keys import payload_hash
from effectlog.log import open_log
from effectlog.model import State
from effectlog.provider import LookupStatus
from effectlog.worker import Worker
from projections.projector import project
from tests.kafka_broker import free_port
from tests.recovery_support import stuck

pytestmark = pytest.mark.timeout(120)


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "effectlog.cli.main", "--log", f"sqlite:///{tmp_path}/log.db",
           "--state", str(tmp_path / "state"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_crashed_worker_recover_reconcile_history(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    key = stuck(Worker(log, "worker-7"), "order-1001", State.DISPATCHED)
    assert cli(tmp_path, "recover", "--once").returncode == 4  # no projection yet
    project(log, tmp_path / "state")

    recovered = cli(tmp_path, "recover", "--once", "--stuck-after", "0s", "--json")
    assert recovered.returncode == 0, recovered.stderr
    report = json.loads(recovered.stdout)
    assert [(c["idempotency_key"], c["state"]) for c in report["issued"]] == [(key, "DISPATCHED")]
    again = json.loads(cli(tmp_path, "recover", "--once", "--stuck-after", "0s", "--json").stdout)
    assert again["issued"] == [] and again["outstanding"] == 1

    provider = f"fake:///{tmp_path}/provider.db"
    done = cli(tmp_path, "reconcile", "--once", "--provider", provider, "--json")
    assert done.returncode == 0, done.stderr
    (row,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert (row["action"], row["state"]) == ("dispatch", "SUCCEEDED")
    assert cli(tmp_path, "reconcile", "--once", "--provider", provider, "--json").stdout == ""

    history = [json.loads(line)["event"] for line in
               cli(tmp_path, "history", key, "--json").stdout.splitlines()]
    assert [(e["transition"], e["fencing_epoch"]) for e in history] == [
        ("CREATE", 0), ("RESERVE", 1), ("DISPATCH", 1), ("CLAIM", 2), ("DISPATCH", 2),
        ("RECORD", 2)]
    assert history[-1]["worker_id"].startswith("reconciler:")
    assert history[-1]["outcome"]["source"] == "redispatch"
    table = cli(tmp_path, "history", key).stdout
    assert "SUCCEEDED (reconciler: re-dispatch)" in table and "(worker)" not in table
    shown = cli(tmp_path, "get", key).stdout
    assert "SUCCEEDED (reconciler: re-dispatch)" in shown, shown


def test_bad_recovery_arguments_exit_2(tmp_path: Path) -> None:
    assert cli(tmp_path, "recover", "--stuck-after", "soon").returncode == 2
    assert cli(tmp_path, "recover", "--kind-deadline", "payment").returncode == 2
    assert cli(tmp_path, "reconcile", "--once").returncode == 2  # --provider is required
    assert cli(tmp_path, "reconcile", "--once", "--provider", "nonsense").returncode == 2


def test_fake_provider_serve_speaks_idempotency_key_http(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "effectlog.cli.main", "fake-provider", "serve", "--port",
         str(port), "--db", str(tmp_path / "fake.db")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                adapter = HttpProvider.from_url(url)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        key = "agent:o1:ticket.create:queue-1"
        body = {"title": "disk full"}
        first = adapter.execute("queue-1", payload_hash(body), key, 1, body)
        assert adapter.execute("queue-1", payload_hash(body), key, 1, body) == first
        assert adapter.lookup(key).status is LookupStatus.CONFIRMED
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "fake provider on" in err
