"""``python -m tools.kafka up|down|status``: the development broker behind ``make kafka-up``.

``lock`` writes ``tools/kafka/jars.lock`` again from ``tools/kafka/pom.xml`` (with Maven).
``up`` starts Apache Kafka in the background on ``$KAFKA_PORT`` (default: a free port) with its
data in ``.effectlog/kafka/``, writes ``host:port`` to ``.effectlog/kafka/bootstrap`` and prints
``KAFKA_BOOTSTRAP=host:port`` as its last line; ``down`` stops it; ``status`` says whether it runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from tools.kafka.broker import KafkaBroker, answers_metadata

HOME = Path(os.environ.get("EFFECTLOG_KAFKA_HOME", ".effectlog/kafka"))


def _pid() -> int | None:
    try:
        pid = int((HOME / "pid").read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def up() -> int:
    bootstrap_file = HOME / "bootstrap"
    if _pid() is not None and bootstrap_file.exists():
        bootstrap = bootstrap_file.read_text().strip()
        if answers_metadata(bootstrap, 5.0):
            print(f"Apache Kafka already running (pid {_pid()})")
            print(f"KAFKA_BOOTSTRAP={bootstrap}")
            return 0
    HOME.mkdir(parents=True, exist_ok=True, mode=0o700)
    port = int(os.environ["KAFKA_PORT"]) if os.environ.get("KAFKA_PORT") else None
    previous = HOME / "ports"
    controller = None
    if port is None and previous.exists():  # same data, same ports as last time
        port, controller = (int(p) for p in previous.read_text().split())
    broker = KafkaBroker(HOME / "data", port=port, controller_port=controller)
    print(f"starting Apache Kafka on {broker.bootstrap} (data in {HOME / 'data'}) ...", flush=True)
    started = time.monotonic()
    broker.start(detach=True)
    assert broker.process is not None
    (HOME / "pid").write_text(str(broker.process.pid))
    previous.write_text(f"{broker.port} {broker.controller_port}")
    bootstrap_file.write_text(broker.bootstrap + "\n")
    print(f"Apache Kafka is up in {time.monotonic() - started:.1f}s (pid {broker.process.pid}, "
          f"log {broker.log_path})")
    print(f"KAFKA_BOOTSTRAP={broker.bootstrap}")
    return 0


def down() -> int:
    pid = _pid()
    if pid is None:
        print("Apache Kafka is not running")
        return 0
    _stop_attached_serve()
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _pid() is not None:
        time.sleep(0.2)
    if _pid() is not None:
        os.kill(pid, signal.SIGKILL)
    (HOME / "pid").unlink(missing_ok=True)
    print(f"Apache Kafka stopped (pid {pid})")
    return 0


def _stop_attached_serve() -> None:
    """Name and stop the ``effectlog serve`` processes still connected to the broker."""
    from tools.kafka.attached import serve_processes, stop_processes

    try:
        port = int((HOME / "bootstrap").read_text().strip().rsplit(":", 1)[1])
    except (OSError, ValueError, IndexError):
        return
    attached = serve_processes(port)
    for pid, command in sorted(attached.items()):
        print(f"stopping effectlog serve (pid {pid}), still attached: {command}")
    for pid in stop_processes(sorted(attached)):
        print(f"effectlog serve (pid {pid}) did not stop within 10s: it stays")


def lock() -> int:
    """Write the jar locks again from their pom.xml (this step needs Maven): Kafka's, and
    Avro's for the interop tests."""
    from tools.avro import interop
    from tools.kafka.broker import KAFKA_VERSION
    from tools.kafka.jars import LOCK, write_lock

    print(f"locked {write_lock(f'kafka {KAFKA_VERSION}')} jars of Apache Kafka in {LOCK}")
    count = write_lock(interop.lock_label(), interop.LOCK, interop.POM)
    print(f"locked {count} jars of Apache Avro in {interop.LOCK}")
    return 0


def status() -> int:
    pid = _pid()
    bootstrap = (HOME / "bootstrap").read_text().strip() if (HOME / "bootstrap").exists() else ""
    if pid is None or not bootstrap or not answers_metadata(bootstrap, 2.0):
        print("Apache Kafka is not running")
        return 1
    print(f"Apache Kafka is running (pid {pid})")
    print(f"KAFKA_BOOTSTRAP={bootstrap}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.kafka", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down", "status", "lock"))
    action = parser.parse_args().action
    return {"up": up, "down": down, "status": status, "lock": lock}[action]()


if __name__ == "__main__":
    sys.exit(main())
