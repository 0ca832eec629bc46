"""Find and delete an effect log's topics by prefix (``effectlog topics delete``).

Only effectlog's own topics match: ``<name>.events``, ``<name>.commands`` and ``<name>.state``
(the changelog) whose ``<name>`` starts with the prefix, so a demo's many runs
(``effects-demo-<ms>``) go with one prefix and nothing else on the cluster does.
"""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from effectlog.errors import BackendUnavailable
from effectlog.log.kafka.producer import error_text
from effectlog.log.kafka.settings import KAFKA_TOPICS, KafkaSettings


def _admin(settings: KafkaSettings) -> AdminClient:
    return AdminClient(settings.client_config())


def _unreachable(settings: KafkaSettings, exc: BaseException) -> BackendUnavailable:
    return BackendUnavailable(f"kafka broker {settings.bootstrap} unreachable: "
                              f"{error_text(exc)}")


def matching_topics(settings: KafkaSettings, prefix: str) -> list[str]:
    """effectlog topics whose log prefix starts with ``prefix``, sorted."""
    try:
        names = _admin(settings).list_topics(timeout=settings.timeout_s).topics
    except KafkaException as exc:
        raise _unreachable(settings, exc) from None
    suffixes = tuple(f".{logical}" for logical in KAFKA_TOPICS)
    return sorted(name for name in names
                  if name.startswith(prefix) and name.endswith(suffixes)
                  and name.rsplit(".", 1)[0].startswith(prefix))


def delete_topics(settings: KafkaSettings, names: list[str]) -> None:
    """Delete ``names``; raises :class:`BackendUnavailable` naming those not deleted."""
    if not names:
        return
    admin = _admin(settings)  # kept alive until every future has its answer
    futures = admin.delete_topics(names, operation_timeout=settings.timeout_s,
                                  request_timeout=settings.timeout_s)
    failed = []
    for name, future in futures.items():
        try:
            future.result(settings.timeout_s)
        except (KafkaException, TimeoutError) as exc:
            failed.append(f"{name} ({error_text(exc)})")
    if failed:
        raise BackendUnavailable(f"kafka topics not deleted: {', '.join(failed)}")
