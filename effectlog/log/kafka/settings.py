"""Settings of the Kafka event log, parsed once from its URL (a frozen dataclass)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from effectlog.errors import InvalidInput
from effectlog.log.base import STATE, TOPICS
from effectlog.log.kafka.client_log import CLIENT_LOG
from effectlog.redact import (
    redact_mapping,
    redact_url,
    register_mapping_secrets,
    register_secret,
    register_url_secrets,
)

DAY_MS = 24 * 3600 * 1000
#: The topics of a Kafka log: events, commands, and the changelog of accepted state.
KAFKA_TOPICS = (*TOPICS, STATE)
ClientConfig = dict[str, Any]
_SCHEMES = {"kafka": None, "kafka+ssl": "SSL", "kafka+sasl": "SASL_SSL"}


_BROKER = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^:\[\]]+)(?::(?P<port>[0-9]{1,5}))?")


def _check_brokers(hosts: str, url: str) -> None:
    """Each ``host[:port]`` of the bootstrap list names a host, and a port from 1 to 65535
    (an IPv6 address in brackets: ``[::1]:9092``)."""
    for broker in hosts.split(","):
        found = _BROKER.fullmatch(broker.strip())
        if found is None or not found["host"].strip() \
                or (found["port"] is not None and not 1 <= int(found["port"]) <= 65535):
            raise InvalidInput(f"kafka URL broker {broker.strip()!r} is not host:port with a "
                               f"port from 1 to 65535: {redact_url(url)!r}")


def _read_properties(path: str) -> tuple[tuple[str, str], ...]:
    """``key=value`` lines of a librdkafka properties file (``#``/``!`` comments allowed)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot read kafka config file {path}: {exc.strerror}") from None
    pairs = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"{path}:{number}: expected key=value")
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """Everything a Kafka log needs, parsed once from its URL; secrets never show in repr."""

    bootstrap: str
    prefix: str = "effects"
    partitions: int = 6
    replication: int | None = None  # None: 3 on a cluster of 3 or more brokers, else 1
    min_insync_replicas: int | None = None  # None: a majority of the replicas (3 -> 2)
    timeout_s: float = 10.0
    min_compaction_lag_ms: int = 7 * DAY_MS
    commands_retention_ms: int = 7 * DAY_MS
    linger_ms: int = 0  # appends are synchronous: send at once, batch what queues meanwhile
    transactional_id: str | None = None  # names this writer instance (zombie fencing)
    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    config_file: str | None = None
    extra: tuple[tuple[str, str], ...] = ()  # librdkafka key=value pairs from config_file

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", self.prefix):
            raise InvalidInput(f"kafka prefix {self.prefix!r} must match [A-Za-z0-9._-]+")
        counts = (self.partitions, self.replication, self.min_insync_replicas)
        if any(n is not None and n < 1 for n in counts) or self.timeout_s <= 0:
            raise InvalidInput("kafka partitions, replication, min_insync_replicas and "
                               "timeout_s must be positive")
        if self.replication is not None and self.min_insync_replicas is not None and \
                self.min_insync_replicas > self.replication:
            raise InvalidInput(f"kafka min_insync_replicas={self.min_insync_replicas} exceeds "
                               f"replication={self.replication}: no append could be acknowledged")

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "sasl_password" and value is not None:
                value = "***"
            elif f.name == "extra":
                value = tuple(redact_mapping(dict(value)).items())
            shown.append(f"{f.name}={value!r}")
        return f"KafkaSettings({', '.join(shown)})"

    @classmethod
    def from_url(cls, url: str) -> KafkaSettings:
        """Parse ``kafka://[user:pass@]host:port[,host:port]?prefix=..&partitions=..``."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in _SCHEMES:
            raise InvalidInput(f"not a kafka URL: {redact_url(url)!r}")
        userinfo, _, hosts = parts.netloc.rpartition("@")
        if not hosts or parts.path not in ("", "/"):
            raise InvalidInput(f"kafka URL must be kafka://host:port[,host:port]?...: "
                               f"{redact_url(url)!r}")
        _check_brokers(hosts, url)
        values: dict[str, Any] = {"bootstrap": hosts, "security_protocol": _SCHEMES[scheme]}
        if userinfo:
            user, _, password = userinfo.partition(":")
            values["sasl_username"] = unquote(user)
            values["sasl_password"] = unquote(password) or None
        known = {f.name: f.type for f in fields(cls) if f.name not in ("bootstrap", "extra")}
        known["config"] = "str"
        for name, raw in parse_qsl(parts.query, keep_blank_values=True):
            kind = known.get(name)
            if kind is None:
                raise InvalidInput(f"unknown kafka URL parameter {name!r}")
            kind = str(kind).removesuffix(" | None")
            try:
                values[name] = int(raw) if kind == "int" else float(raw) if kind == "float" else raw
            except ValueError:
                raise InvalidInput(f"kafka URL parameter {name}={raw!r} is not a number") from None
        config_file = values.pop("config", None) or values.get("config_file")
        if config_file:
            values["config_file"] = config_file
            values["extra"] = _read_properties(config_file)
        settings = cls(**values)
        from effectlog.log.security import check_client_security

        check_client_security(settings.client_config())  # e.g. SASL without a mechanism
        register_url_secrets(url)
        register_secret(settings.sasl_password)
        register_mapping_secrets(dict(settings.extra))
        return settings

    def topic(self, logical: str) -> str:
        """The Kafka topic name of a logical topic (``events`` -> ``<prefix>.events``)."""
        if logical not in KAFKA_TOPICS:
            raise InvalidInput(f"unknown topic {logical!r}: expected one of "
                               f"{', '.join(KAFKA_TOPICS)}")
        return f"{self.prefix}.{logical}"

    def client_config(self) -> ClientConfig:
        """librdkafka settings shared by producer, consumer and admin client."""
        timeout_ms = max(1000, int(self.timeout_s * 1000))
        conf: ClientConfig = {
            "bootstrap.servers": self.bootstrap,
            "client.id": "effectlog",
            "socket.connection.setup.timeout.ms": timeout_ms,
            # A request unanswered within timeout_s fails and drops its connection
            # (socket.max.fails=1), so the next one goes where the metadata now says. A paused
            # broker keeps its connections open: with the default 60 s a client stayed on a
            # zombie leader for a minute. 100 ms under transaction.timeout.ms, as librdkafka asks.
            "socket.timeout.ms": timeout_ms - 100,
            "log.connection.close": False,
            "logger": CLIENT_LOG,  # librdkafka's lines, one level down (client_log)
        }
        conf.update(self.extra)
        for key, value in (("security.protocol", self.security_protocol),
                           ("sasl.mechanism", self.sasl_mechanism),
                           ("sasl.username", self.sasl_username),
                           ("sasl.password", self.sasl_password),
                           ("ssl.ca.location", self.ssl_cafile)):
            if value is not None:
                conf[key] = value
        return conf
