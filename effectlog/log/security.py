"""Checks of a Kafka client's security settings before librdkafka sees them.

librdkafka reports an incomplete SASL set-up only when a client is constructed, as a
``KafkaException`` (a SASL protocol without a mechanism falls back to GSSAPI, which the
confluent-kafka wheels are not built with). Checked here, it is one clear line instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from effectlog.errors import InvalidInput

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: SASL mechanisms built into the librdkafka of the confluent-kafka wheels (no GSSAPI).
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
_NEEDS_PASSWORD = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def check_client_security(config: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidInput` unless the librdkafka ``config`` names a known security
    protocol and, for SASL, a built-in mechanism with the credentials it needs."""
    protocol = str(config.get("security.protocol") or "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise InvalidInput(f"unknown kafka security_protocol {protocol!r}: use one of "
                           f"{', '.join(PROTOCOLS)}")
    if not protocol.startswith("SASL_"):
        return
    mechanism = str(config.get("sasl.mechanism") or config.get("sasl.mechanisms") or "").upper()
    if not mechanism:
        raise InvalidInput(f"security_protocol={protocol} needs sasl_mechanism= one of "
                           f"{', '.join(MECHANISMS)} in the kafka URL or its config file")
    if mechanism not in MECHANISMS:
        raise InvalidInput(f"sasl_mechanism={mechanism} is not available: use one of "
                           f"{', '.join(MECHANISMS)} (this librdkafka has no GSSAPI)")
    if mechanism in _NEEDS_PASSWORD and not (config.get("sasl.username")
                                             and config.get("sasl.password")):
        raise InvalidInput(f"sasl_mechanism={mechanism} needs sasl_username and sasl_password "
                           "(in the URL, or better in a config file)")
