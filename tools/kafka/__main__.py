"""``python -m tools.kafka up|down|status``: the development broker behind ``make kafka-up``.

``lock`` writes ``tools/kafka/jars.lock`` again from ``tools/kafka/pom.xml`` (with Maven).
``up`` starts Apache Kafka in the background on ``$KAFKA_PORT`` (default: a free port) with its
data in ``.effectlog/kafka/``, writes ``host:port`` to ``.effectlog/kafka/bootstrap`` and prints
``KAFKA_BOOTSTRAP=host:port`` as its last line; ``down`` stops it; ``status`` says whether it runs.
``up --brokers 3`` (``make kafka-up BROKERS=3``) starts a KRaft cluster of three nodes instead
(:mod:`tools.kafka.cluster`, data in ``.effectlog/kafka/cluster-3/``) and writes the bootstrap
list the same way; ``down`` stops every node.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from tools.kafka.broker import BrokerError, KafkaBroker, answers_metadata
from tools.kafka.cluster import KafkaCluster

HOME = Path(os.environ.get("EFFECTLOG_KAFKA_HOME", ".effectlog/kafka"))


def _pids() -> list[int]:
    """The running processes of ``pid`` (one line per node)."""
    try:
        listed = [int(line) for line in (HOME / "pid").read_text().split()]
    except (OSError, ValueError):
        return []
    alive = []
    for pid in listed:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except OSError:
            continue
    return alive


def up(brokers: int = 1) -> int:
    bootstrap_file = HOME / "bootstrap"
    running = _pids()
    if running:
        return _already_running(running, brokers)
    HOME.mkdir(parents=True, exist_ok=True, mode=0o700)
    if brokers > 1:
        return _up_cluster(brokers)
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


def _already_running(running: list[int], brokers: int) -> int:
    """A recorded broker process is alive: never start another beside it, whatever it answers
    (a paused or slow broker is not a dead one, and a second start would overwrite the pid file
    ``down`` stops). 0 when it is the one asked for and answers; else 3."""
    pids = " ".join(map(str, running))
    if len(running) != brokers:
        print(f"Apache Kafka already runs with {len(running)} broker(s) (pids {pids}), not "
              f"{brokers}: make kafka-down first", file=sys.stderr)
        return 3
    bootstrap_file = HOME / "bootstrap"
    bootstrap = bootstrap_file.read_text().strip() if bootstrap_file.exists() else ""
    if bootstrap and answers_metadata(bootstrap, 5.0):
        print(f"Apache Kafka already running (pid {pids})")
        print(f"KAFKA_BOOTSTRAP={bootstrap}")
        return 0
    print(f"Apache Kafka already runs (pid {pids}) but {bootstrap or 'its address'} did not "
          f"answer within 5s (paused or still starting?): make kafka-down first (if pid {pids} "
          f"is not Kafka, remove {HOME / 'pid'})", file=sys.stderr)
    return 3


def _up_cluster(brokers: int) -> int:
    """Start ``brokers`` nodes (same data and ports as the last cluster of that size)."""
    home = HOME / f"cluster-{brokers}"
    previous = home / "ports"
    ports = None
    if previous.exists():
        ports = [(int(a), int(b)) for a, b in
                 (line.split() for line in previous.read_text().splitlines() if line)]
    cluster = KafkaCluster(home, brokers, ports=ports)
    print(f"starting an Apache Kafka cluster of {brokers} nodes on {cluster.bootstrap} "
          f"(data in {home}) ...", flush=True)
    started = time.monotonic()
    cluster.start(detach=True)
    (HOME / "pid").write_text("".join(f"{pid}\n" for pid in cluster.pids()))
    home.mkdir(parents=True, exist_ok=True)
    previous.write_text("".join(f"{p} {c}\n" for p, c in cluster.ports))
    (HOME / "bootstrap").write_text(cluster.bootstrap + "\n")
    print(f"Apache Kafka is up in {time.monotonic() - started:.1f}s ({brokers} nodes, pids "
          f"{' '.join(map(str, cluster.pids()))}, logs {home}/node-*/broker.log)")
    print(f"KAFKA_BOOTSTRAP={cluster.bootstrap}")
    return 0


def down() -> int:
    pids = _pids()
    if not pids:
        print("Apache Kafka is not running")
        return 0
    _stop_attached_serve()
    for pid in pids:  # all at once: the last node of a cluster alone has no controller quorum
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _pids():
        time.sleep(0.2)
    for pid in _pids():
        os.kill(pid, signal.SIGKILL)
    (HOME / "pid").unlink(missing_ok=True)
    print(f"Apache Kafka stopped (pid {' '.join(map(str, pids))})")
    return 0


def _stop_attached_serve() -> None:
    """Name and stop the ``effectlog serve`` processes still connected to the broker."""
    from tools.kafka.attached import serve_processes, stop_processes

    try:
        ports = [int(address.rsplit(":", 1)[1])
                 for address in (HOME / "bootstrap").read_text().strip().split(",")]
    except (OSError, ValueError, IndexError):
        return
    attached: dict[int, str] = {}
    for port in ports:  # any node of a cluster
        attached.update(serve_processes(port))
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
    pids = _pids()
    bootstrap = (HOME / "bootstrap").read_text().strip() if (HOME / "bootstrap").exists() else ""
    if not pids or not bootstrap or not answers_metadata(bootstrap, 2.0):
        print("Apache Kafka is not running")
        return 1
    print(f"Apache Kafka is running (pid {' '.join(map(str, pids))})")
    print(f"KAFKA_BOOTSTRAP={bootstrap}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.kafka", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down", "status", "lock"))
    parser.add_argument("--brokers", type=int, default=int(os.environ.get("BROKERS") or 1),
                        help="up: nodes to start (1, or a KRaft cluster of 3 or more)")
    args = parser.parse_args()
    if args.brokers < 1 or args.brokers == 2:  # two voters: either one down stops the quorum
        parser.error(f"--brokers is 1 or a cluster of 3 or more, not {args.brokers}")
    try:
        if args.action == "up":
            return up(args.brokers)
        return {"down": down, "status": status, "lock": lock}[args.action]()
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 4


if __name__ == "__main__":
    sys.exit(main())
