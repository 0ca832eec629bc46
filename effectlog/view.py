"""A key's state folded straight from the log with the projector's own rules.

Cheap where reading one key is an index lookup (SQLite, memory): the worker's
compare-and-append strategy builds on it, and tools that look at one key once (``history``,
tests) use it. On Kafka it scans the key's partition; workers there ask the judge instead.
"""

from __future__ import annotations

from effectlog.codec import Codec, event_codec
from effectlog.errors import CodecError, UnknownWriterSchema
from effectlog.log.base import EVENTS, EventLog, Record
from effectlog.machine import Expiry, fold
from effectlog.model import EffectEvent


def decode_events(log: EventLog, key: str, records: list[Record] | None = None, *,
                  codec: Codec | None = None, judging: bool = False
                  ) -> list[EffectEvent | Expiry]:
    """The decodable events of ``key`` in log order, a tombstone (a record without a value)
    as an :class:`~effectlog.machine.Expiry` (undecodable ones, and events of another key
    under this record key, are skipped here; the projector stores them as rejected).

    ``judging``: the fold is a verdict (a compare-and-append worker's), and a record of a
    writer schema ``codec`` does not know raises
    :class:`~effectlog.judge.premises.CannotJudge`: a newer release wrote it, and what this
    release's projector would call undecodable (rejected), the newer one may have accepted.
    """
    codec = codec or event_codec()
    events: list[EffectEvent | Expiry] = []
    for record in log.read_key(EVENTS, key) if records is None else records:
        if not record.value:
            events.append(Expiry(record.key, record.expires))
            continue
        try:
            event = EffectEvent.from_record(codec.decode(record.value))
        except UnknownWriterSchema as exc:
            if judging:
                from effectlog.judge.premises import CannotJudge

                raise CannotJudge(f"{key}: the record at offset {record.offset} was written "
                                  f"by another release ({exc}): this worker cannot judge the "
                                  "key; upgrade it to the release that wrote it") from None
            continue
        except (CodecError, KeyError, ValueError):
            continue
        if event.idempotency_key == record.key:
            events.append(event)
    return events


class LogView:
    """A key's current state, folded from its records in ``log`` (decoded with ``codec``)."""

    def __init__(self, log: EventLog, codec: Codec | None = None) -> None:
        self.log = log
        self.codec = codec

    def current(self, key: str) -> EffectEvent | None:
        return fold(decode_events(self.log, key, codec=self.codec))[0]

    def current_at(self, key: str) -> tuple[EffectEvent | None, int | None]:
        """The current snapshot and the offset of the key's last record, read together: a
        worker's verdict on a compare-and-append log (``judging``, see :func:`decode_events`)."""
        records = self.log.read_key(EVENTS, key)
        last = records[-1].offset if records else None
        return fold(decode_events(self.log, key, records, codec=self.codec, judging=True))[0], last
