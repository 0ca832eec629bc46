"""The soak's fault drivers: processes SIGKILLed at seeded moments and started again.

:class:`ServeUnderFire` keeps one ``effectlog serve`` process alive and SIGKILLs it after a
seeded random uptime, and counts how many of its starts got to serve;
:class:`BrokerUnderFire` SIGKILLs the Apache Kafka broker every seeded random interval and
starts it again on the same ports and data; :class:`LeaderUnderFire` does the same on a
cluster to the node leading a random events partition, and waits until every replica is back
in sync before the next. Each runs in its own thread until :meth:`stop`.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import urllib3
from confluent_kafka import KafkaException

from tools.kafka.broker import BrokerError, KafkaBroker
from tools.kafka.cluster import KafkaCluster

EFFECTLOG = Path(sys.executable).with_name("effectlog")


#: How long the first starts of a soak's ``serve`` may take to serve before being killed anyway.
FIRST_SERVE_WITHIN_S = 60.0


class ServeUnderFire:
    """One ``effectlog serve`` process (``args`` after ``effectlog``, which serve on ``url``),
    SIGKILLed after a seeded random uptime and started again, until :meth:`stop` ends it
    with SIGTERM. An instance that exits by itself is started again too; ``exits`` counts
    those by exit status (4: the log was unreachable when it started; anything else is a
    crash). ``starts`` counts the processes started, ``served`` those seen serving (their
    ``/healthz`` listed a partition as serving) before they ended, ``ready_s`` how long
    each of those took to. Until a start has served, none is killed before it serves (for at
    most :data:`FIRST_SERVE_WITHIN_S`): on a loaded machine every start of a short soak could
    otherwise die while still starting, and the soak would test no serving instance."""

    def __init__(self, args: list[str], url: str, stderr: Path, env: dict[str, str],
                 rng: random.Random, uptime_s: tuple[float, float], name: str = "serve") -> None:
        self.args = [str(EFFECTLOG), *args]
        self.url = url
        self.name = name
        self.stderr = stderr
        self.env = env
        self.rng = rng
        self.uptime_s = uptime_s
        self.kills = 0
        self.starts = 0
        self.ready_s: list[float] = []  # per start that got to serve: seconds until it did
        self.exits: Counter[int] = Counter()
        self._http = urllib3.PoolManager(retries=False,
                                         timeout=urllib3.Timeout(connect=0.5, read=1.5))
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name=f"{name}-killer", daemon=True)

    def start(self) -> ServeUnderFire:
        self._thread.start()
        return self

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.stderr.open("ab") as err:
            return subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=err,
                                    stdin=subprocess.DEVNULL, env=self.env)

    def _run(self) -> None:
        while not self._stop.is_set():
            proc = self._proc = self._spawn()
            self.starts += 1
            spawned = time.monotonic()
            until = spawned + self.rng.uniform(*self.uptime_s)
            seen, wait_serving = False, self.served == 0
            while proc.poll() is None and (time.monotonic() < until or (
                    wait_serving and not seen
                    and time.monotonic() < spawned + FIRST_SERVE_WITHIN_S)):
                if not seen and self._serving():
                    seen = True
                    self.ready_s.append(time.monotonic() - spawned)
                if self._stop.wait(min(0.2, max(0.05, until - time.monotonic()))):
                    return
            if proc.poll() is not None:  # exited by itself: start it again after a moment
                self.exits[proc.returncode] += 1
                self._stop.wait(1.0)
                continue
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            self.kills += 1

    def _serving(self) -> bool:
        """Whether the instance's ``/healthz`` (200 or 503) lists a partition as serving."""
        try:
            body = json.loads(self._http.request("GET", self.url + "/healthz").data)
            return "serving" in body["partitions"].values()
        except (urllib3.exceptions.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return False  # not listening yet, or gone

    @property
    def served(self) -> int:
        return len(self.ready_s)

    @property
    def crashes(self) -> int:
        """Exits by itself other than with status 4 (backend unavailable at start)."""
        return sum(n for code, n in self.exits.items() if code != 4)

    def stop(self) -> None:
        """SIGTERM the current instance and wait for it (SIGKILL after 60 s)."""
        self._stop.set()
        self._thread.join(30)
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class BrokerUnderFire:
    """SIGKILLs ``broker`` every seeded random ``every_s`` seconds and restarts it (same
    ports, same data), until :meth:`stop` or ``limit`` kills; the broker is left running."""

    def __init__(self, broker: KafkaBroker, rng: random.Random,
                 every_s: tuple[float, float], limit: int | None = None) -> None:
        self.broker = broker
        self.limit = limit
        self.rng = rng
        self.every_s = every_s
        self.kills = 0
        self.down_s = 0.0  # total seconds from a SIGKILL until the broker answered again
        self.error: BrokerError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-killer", daemon=True)

    def start(self) -> BrokerUnderFire:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.rng.uniform(*self.every_s)) and not self._done():
            killed = time.monotonic()
            self.broker.kill()
            self.kills += 1
            try:
                self.broker.start()
            except BrokerError as exc:  # reported by the soak; the checks will fail
                self.error = exc
                return
            finally:
                self.down_s += time.monotonic() - killed

    def _done(self) -> bool:
        return self.limit is not None and self.kills >= self.limit

    def stop(self) -> None:
        """No more kills; waits for a restart under way to finish."""
        self._stop.set()
        self._thread.join(120)


class LeaderUnderFire:
    """SIGKILLs the node leading a seeded random partition of ``topic`` every seeded random
    ``every_s`` seconds, until :meth:`stop` or ``limit`` kills; each time waits until another node leads that
    partition (``failover_s``), starts the node again on its ports and data, and waits until
    every replica of ``topics`` is in sync before the next interval begins."""

    def __init__(self, cluster: KafkaCluster, topic: str, topics: list[str],
                 rng: random.Random, every_s: tuple[float, float],
                 limit: int | None = None) -> None:
        self.cluster = cluster
        self.limit = limit
        self.topic = topic
        self.topics = topics
        self.rng = rng
        self.every_s = every_s
        self.kills = 0
        self.down_s = 0.0  # total seconds from a SIGKILL until the node answered again
        self.failover_s: list[float] = []  # per kill: until the partition had another leader
        self.error: BrokerError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-killer", daemon=True)

    def start(self) -> LeaderUnderFire:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.rng.uniform(*self.every_s)) and not self._done():
            try:
                self._kill_one()
            except KafkaException:  # no metadata this round: try again next interval
                continue
            except BrokerError as exc:  # reported by the soak; the checks will fail
                self.error = exc
                return

    def _kill_one(self) -> None:
        leaders = self.cluster.leaders(self.topic)
        partition = self.rng.choice(sorted(leaders))
        node = leaders[partition]
        if node < 0:
            return  # no leader right now: nothing to kill this round
        killed = time.monotonic()
        self.cluster.node(node).kill()
        self.kills += 1
        deadline = killed + 120
        while time.monotonic() < deadline:
            try:
                moved = self.cluster.leaders(self.topic, timeout=2.0).get(partition, -1)
            except (BrokerError, KafkaException):  # metadata from a node going down
                moved = -1
            if moved > 0 and moved != node:
                self.failover_s.append(time.monotonic() - killed)
                break
            time.sleep(0.2)
        try:
            self.cluster.node(node).start()
        finally:
            self.down_s += time.monotonic() - killed
        while time.monotonic() < killed + 300 and not self.cluster.fully_replicated(self.topics):
            time.sleep(0.5)

    def _done(self) -> bool:
        return self.limit is not None and self.kills >= self.limit

    def stop(self) -> None:
        """No more kills; waits for a restart under way to finish."""
        self._stop.set()
        self._thread.join(300)
