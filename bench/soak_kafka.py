"""The soak's arrangement on Apache Kafka: its own broker, topics and ``serve`` instances.

The soak starts a broker from the tools/kafka launcher (127.0.0.1, data in the work
directory) and creates the topics. Several ``effectlog serve`` instances (each with its own
state directory and HTTP port) share the events partitions through their consumer group;
each is SIGKILLed after a seeded random uptime and started again, so its partitions move
to the others and back. Workers read state through all of them (``--server`` with every
URL: a dead one is skipped). The broker itself is SIGKILLed and restarted every seeded
random interval; with ``brokers`` of 3 or more the soak runs a KRaft cluster instead (topics
with replication 3 and ``min.insync.replicas=2``) and SIGKILLs the node leading a random
events partition every interval, restarting it once another node leads that partition.
Recovery until quiet then runs on the first instance's state directory;
the other instances' directories, left by SIGKILLed owners, are caught up from their
stored offsets and must digest equal to a clean rebuild too.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

import urllib3
from soak_drivers import BrokerUnderFire, LeaderUnderFire, ServeUnderFire

from effectlog.cli.demo.run import KAFKA_STUCK_AFTER_S
from effectlog.log.kafka import KafkaSettings, create_topics
from tools.kafka.broker import KafkaBroker, free_port
from tools.kafka.cluster import KafkaCluster

PARTITIONS = 6
SESSION_TIMEOUT = "3s"  # a SIGKILLed instance's partitions move after this


class KafkaArrangement:
    """A broker (or a cluster's partition leaders) under fire and ``serves`` serve instances
    under fire."""

    stuck_after_s = KAFKA_STUCK_AFTER_S  # a live worker waits on the projection each step

    def __init__(self, work: Path, provider_spec: str, seed: int, env: dict[str, str], *,
                 serves: int, serve_uptime_s: tuple[float, float],
                 broker_every_s: tuple[float, float], broker_kills: int | None = None,
                 brokers: int = 1, fence_after_s: float | None = None) -> None:
        self.work = work
        overrides = {} if fence_after_s is None else {
            "broker.session.timeout.ms": str(int(fence_after_s * 1000)),
            "broker.heartbeat.interval.ms": str(min(2000, int(fence_after_s * 1000) // 4))}
        self.kafka: KafkaBroker | KafkaCluster = (
            KafkaBroker(work / "kafka", overrides=overrides) if brokers == 1
            else KafkaCluster(work / "kafka", brokers, overrides=overrides))
        self.kafka.start()
        self.log_url = f"kafka://{self.kafka.bootstrap}?prefix=soak&partitions={PARTITIONS}"
        settings = KafkaSettings.from_url(self.log_url)
        self.replication = create_topics(settings).durability.why
        ports = [free_port() for _ in range(serves)]
        self.urls = [f"http://127.0.0.1:{port}" for port in ports]
        self.states = [work / f"state-{i}" for i in range(serves)]
        self.settle_state = self.states[0]
        self.serves = [
            ServeUnderFire(["--log", self.log_url, "--state", str(state), "serve",
                            "--http", f"127.0.0.1:{port}", "--provider", provider_spec,
                            "--poll", "1s", "--stuck-after", f"{self.stuck_after_s * 1000:.0f}ms",
                            "--command-timeout", f"{2000 * self.stuck_after_s:.0f}ms",
                            "--session-timeout", SESSION_TIMEOUT], url,
                           work / f"serve-{i}.log", env, random.Random(seed * 1000 + i),
                           serve_uptime_s, name=f"serve{i}")
            for i, (state, port, url) in enumerate(zip(self.states, ports, self.urls,
                                                       strict=True))]
        rng = random.Random(seed * 1000 + 999)
        self.broker_fire: BrokerUnderFire | LeaderUnderFire = (
            BrokerUnderFire(self.kafka, rng, broker_every_s, broker_kills)
            if isinstance(self.kafka, KafkaBroker) else
            LeaderUnderFire(self.kafka, settings.topic("events"),
                            [settings.topic("events"), settings.topic("commands")], rng,
                            broker_every_s, broker_kills))
        self.fired = "broker" if isinstance(self.kafka, KafkaBroker) else "leader"

    def start(self) -> None:
        """Start the serve instances, wait until every partition is served, then the
        broker's kills."""
        for serve in self.serves:
            serve.start()
        self._wait_all_served(within_s=120)
        self.broker_fire.start()

    def worker_args(self) -> list[str]:
        return ["--server", ",".join(self.urls)]

    def kills(self) -> dict[str, int]:
        return {"serve": sum(s.kills for s in self.serves), self.fired: self.broker_fire.kills}

    def stop_faults(self) -> None:
        """No more kills: the broker stays up, the serve instances stop (SIGTERM)."""
        self.broker_fire.stop()
        for serve in self.serves:
            serve.stop()
        if self.broker_fire.error is not None:
            raise self.broker_fire.error

    def caught_up_states(self) -> list[Path]:
        """State directories besides the settler's: each caught up before it is compared."""
        return [state for state in self.states[1:] if state.exists()]

    def crashes(self) -> int:
        return sum(s.crashes for s in self.serves)

    def instances(self) -> list[ServeUnderFire]:
        return list(self.serves)

    def notes(self) -> list[str]:
        refused = sum(s.exits[4] for s in self.serves)
        fire = self.broker_fire
        if isinstance(fire, LeaderUnderFire):
            failover = (f"failover {statistics.median(fire.failover_s):.1f}s median, "
                        f"{max(fire.failover_s):.1f}s max" if fire.failover_s else "no failover")
            return [f"leader nodes down {fire.down_s:.0f}s in all", failover,
                    f"{refused} serve starts refused (exit 4)"]
        return [f"broker down {fire.down_s:.0f}s in all",
                f"{refused} serve starts refused while it was down (exit 4)"]

    def close(self) -> None:
        self.kafka.stop()

    def _wait_all_served(self, within_s: float) -> None:
        http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=1, read=5))
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            serving: set[str] = set()
            for url in self.urls:
                try:
                    body = json.loads(http.request("GET", url + "/healthz").data)
                    serving |= {p for p, s in body["partitions"].items() if s == "serving"}
                except (urllib3.exceptions.HTTPError, ValueError, KeyError, TypeError):
                    continue
            if len(serving) == PARTITIONS:
                return
            time.sleep(0.3)
        raise TimeoutError(f"the serve instances did not serve every partition within "
                           f"{within_s:.0f}s; see {self.work}/serve-*.log")
