"""Small things users expect: a version, shell completion, help texts that read as text,
`replay --key` of an unknown key exiting 1, the fake provider answering `/` and `/healthz`,
and serve's `/metrics` as fresh as `/healthz`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from effectlog.cli.main import COMMANDS
from effectlog.log import open_log
from effectlog.worker import Worker
from tests.kafka_broker import free_port

KEY = "agent:op-1:email.send:mailto:a@example.com"


def cli(*args: str, cwd: Path | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "effectlog.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60, env=env)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_version_from_the_package_metadata() -> None:
    from importlib.metadata import version

    done = cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"effectlog, version {version('effectlog')}"
    probe = ("import sys, effectlog; cheap = 'importlib.metadata' not in sys.modules;"
             "print(cheap, effectlog.__version__)")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           timeout=60)
    assert shown.stdout.split() == ["True", version("effectlog")], shown.stderr


def test_bash_completion_script_completes_commands(tmp_path: Path) -> None:
    env = {**os.environ, "_EFFECTLOG_COMPLETE": "bash_source"}
    script = subprocess.run([sys.executable, "-m", "effectlog.cli.entry"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert "_effectlog_completion" in script.stdout
    completed = subprocess.run(
        [sys.executable, "-m", "effectlog.cli.entry"], capture_output=True, text=True,
        timeout=60, env={**os.environ, "_EFFECTLOG_COMPLETE": "bash_complete",
                         "COMP_WORDS": "effectlog re", "COMP_CWORD": "1"})
    assert {"plain,rebuild", "plain,reconcile", "plain,recover", "plain,replay"} <= set(
        completed.stdout.split())


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_texts_carry_no_restructuredtext_backticks(command: str) -> None:
    done = cli(command, "--help")
    assert done.returncode == 0 and "`" not in done.stdout, done.stdout


def test_append_help_lists_all_seven_transitions() -> None:
    shown = cli("append", "--help").stdout
    for name in ("create", "reserve", "claim", "dispatch", "record", "unknown",
                 "await_approval"):
        assert f"\n    {name} " in shown


def test_replay_of_an_unknown_key_exits_1_as_history_does(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    Worker(log, "w1").create("op-1", "email.send", "mailto:a@example.com", {})
    log.close()
    base = ("--log", f"sqlite:///{tmp_path}/log.db")
    assert cli(*base, "replay", "--key", KEY).returncode == 0
    for command in ("replay", "--key"), ("history",):
        done = cli(*base, *command, "agent:nope:email.send:x")
        assert done.returncode == 1 and done.stderr == "error: no events for key " \
            "agent:nope:email.send:x\n", done.stderr


def test_fake_provider_serve_answers_root_and_healthz(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "effectlog.cli.main", "fake-provider",
                             "serve", "--port", str(port), "--db", str(tmp_path / "fake.db")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                status, body = get(f"http://127.0.0.1:{port}/healthz")
                break
            except OSError:
                time.sleep(0.1)
        assert (status, json.loads(body)) == (200, {"ok": True})
        status, body = get(f"http://127.0.0.1:{port}/")
        assert status == 200 and "GET /lookup" in json.loads(body)["endpoints"]
        assert get(f"http://127.0.0.1:{port}/nowhere")[0] == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0


def test_metrics_are_as_fresh_as_healthz(tmp_path: Path) -> None:
    """``/metrics`` refreshes its gauges when asked (not only every few seconds), from the
    same figures ``/healthz`` reports."""
    from consumers.node.node import Node, NodeSettings
    from effectlog.client import StateClient

    log_url = f"sqlite:///{tmp_path}/log.db"
    log = open_log(log_url)
    worker = Worker(log, "w1")
    worker.create("op-1", "email.send", "mailto:a@example.com", {})
    node = Node(log_url, NodeSettings(state_dir=tmp_path / "state", http_port=0,
                                      observe_every_s=3600)).start()
    try:
        worker.reserve(KEY)
        worker.dispatch(KEY)
        worker.unknown(KEY, "timeout")
        assert worker.last_position is not None
        StateClient(node.url).get(KEY, min_offset=worker.last_position.offset)  # applied
        health = json.loads(get(node.url + "/healthz")[1])
        text = get(node.url + "/metrics")[1]
        assert health["projector_lag"] == 0 and "effectlog_projector_lag 0.0" in text
        assert "effectlog_unresolved_unknown 1.0" in text  # no wait for the hourly refresh
    finally:
        node.stop(30)
        node.close()
        log.close()
