"""The projector: reads the events topic of any EventLog and applies it to RocksDB.

It resumes from the offsets stored in the projection (never consumer-group offsets),
compares them with the log's end offsets to know and report its lag, and applies one poll
batch at a time per partition (see :class:`projections.partition.PartitionWriter`).

Reading, decoding and applying form a short pipeline: while one batch is judged and
written, the next is already read and, when catching up, decoded in a helper process
(:mod:`projections.decoding`). Only applied batches move the stored offsets, so whatever
is in flight when the process dies is simply read again.

When ``follow_swaps`` is on, it notices a rebuild swapping a new generation in and
continues on that one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from effectlog.errors import BackendUnavailable
from effectlog.log.base import EVENTS, EventLog, Record
from effectlog.private_fs import make_private_dirs
from projections import layout, lineage
from projections.decoding import InlineDecoder, ProcessDecoder
from projections.partition import PartitionWriter
from projections.rocksdb import METADATA

logger = logging.getLogger(__name__)

DecoderChoice = Literal["auto", "inline", "process"]


@dataclass(frozen=True, slots=True)
class ProjectorSettings:
    """Tuning knobs; the defaults suit both SQLite and Kafka.

    ``decoder``: ``inline`` decodes in this process; ``process`` in a helper process;
    ``auto`` uses the helper for batches of at least ``process_decode_min`` records
    (catching up) and decodes small batches (tailing the log) inline.
    """

    batch_size: int = 2000
    cache_size: int = 50_000
    idle_sleep_s: float = 0.05
    read_timeout_s: float = 0.0
    empty_reads_before_giving_up: int = 3
    decoder: DecoderChoice = "auto"
    process_decode_min: int = 1000
    pipeline_depth: int = 2
    log_every_s: float = 10.0


@dataclass(slots=True)
class Progress:
    """Where a run stands: records handled so far and the lag per partition."""

    records: int = 0
    accepted: int = 0
    rejected: int = 0
    ends: dict[int, int] = field(default_factory=dict)
    next_offsets: dict[int, int] = field(default_factory=dict)

    @property
    def lag(self) -> dict[int, int]:
        return {p: max(0, end - self.next_offsets.get(p, 0)) for p, end in self.ends.items()}

    @property
    def total_lag(self) -> int:
        return sum(self.lag.values())


ProgressCallback = Callable[[Progress], None]


@dataclass(slots=True)
class _InFlight:
    """A batch read from ``start`` and handed to a decoder, not applied yet."""

    partition: int
    start: int
    records: list[Record]
    decoder: InlineDecoder | ProcessDecoder


class Projector:
    """Applies the log's events topic to the projection under ``state_dir``."""

    def __init__(self, log: EventLog, state_dir: str | os.PathLike[str],
                 settings: ProjectorSettings | None = None, *, follow_swaps: bool = True) -> None:
        self.log = log
        self.state_dir = Path(state_dir)
        self.settings = settings or ProjectorSettings()
        self.follow_swaps = follow_swaps
        self._generation: Path | None = None
        self._writers: dict[int, PartitionWriter] = {}
        self._empty_reads: dict[int, int] = {}
        self._cursors: dict[int, int] = {}  # next offset to read, per partition
        self._inflight: deque[_InFlight] = deque()
        self._inline = InlineDecoder()
        self._helper: ProcessDecoder | None = None
        self._helper_failed = False
        self._turn = 0

    # -- lifecycle -----------------------------------------------------------------------

    def open(self) -> None:
        """Open (creating if needed) one RocksDB per partition of the events topic."""
        self._close_writers()
        generation = layout.ensure_generation(self.state_dir)
        try:
            for partition in range(self.log.partitions(EVENTS)):
                path = make_private_dirs(layout.partition_dir(generation, partition))
                writer = PartitionWriter(path, partition, self.settings.cache_size,
                                         trust_first=self.log.compacted)
                self._writers[partition] = writer
                lineage.bind(writer.db.get_column_family(METADATA), self.log, partition,
                             writer.next_offset, f"the projection {path}")
                self._cursors[partition] = writer.next_offset
        except BaseException:
            self._close_writers()
            raise
        self._generation = generation
        logger.info("projecting %s into %s", self.log.url, generation)

    def close(self) -> None:
        self._close_writers()
        self._drop_helper(failed=False)

    def __enter__(self) -> Projector:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state ---------------------------------------------------------------------------

    def next_offsets(self) -> dict[int, int]:
        """The stored next offset of every partition."""
        self._ensure_open()
        return {p: w.next_offset for p, w in sorted(self._writers.items())}

    def lag(self, ends: dict[int, int] | None = None) -> dict[int, int]:
        """Records not yet applied, per partition (log end offset minus stored offset)."""
        ends = self.log.end_offsets(EVENTS) if ends is None else ends
        nexts = self.next_offsets()
        return {p: max(0, end - nexts.get(p, 0)) for p, end in sorted(ends.items())}

    # -- work ----------------------------------------------------------------------------

    def step(self, ends: dict[int, int], progress: Progress | None = None) -> int:
        """Keep the pipeline full up to ``ends`` and apply the oldest batch; records handled."""
        self._ensure_open()
        self._follow_swap()
        self._fill(ends)
        if not self._inflight:
            return 0
        batch = self._inflight.popleft()
        try:
            decoded = batch.decoder.receive()
        except BackendUnavailable as exc:
            if batch.decoder is self._inline:
                raise
            logger.warning("%s; decoding in this process from now on", exc)
            self._drop_helper(failed=True)
            self._reset_pipeline()
            return 0
        writer = self._writers[batch.partition]
        if batch.start != writer.next_offset:  # read for a state that is gone: read again
            self._cursors[batch.partition] = writer.next_offset
            self._drain()
            return 0
        applied = writer.apply(batch.records, decoded)
        if progress is not None:
            progress.records += applied.records
            progress.accepted += applied.accepted
            progress.rejected += applied.rejected
            progress.next_offsets = self.next_offsets()
        return applied.records

    def run(self, *, once: bool = False, stop: threading.Event | None = None,
            on_progress: ProgressCallback | None = None) -> Progress:
        """Project until ``stop`` is set, or with ``once`` until the end offsets seen at the
        start are reached. A stop request takes effect between batches."""
        self._ensure_open()
        stop = stop or threading.Event()
        ends = self.log.end_offsets(EVENTS)
        progress = Progress(ends=dict(ends), next_offsets=self.next_offsets())
        if progress.total_lag:
            logger.info("projection is %d events behind the log (%s)", progress.total_lag,
                        _format_lag(progress.lag))
        if on_progress is not None:
            on_progress(progress)
        reported = time.monotonic()
        while not stop.is_set():
            handled = self.step(ends, progress)
            if handled and on_progress is not None:
                on_progress(progress)
            if handled and time.monotonic() - reported >= self.settings.log_every_s:
                reported = time.monotonic()
                logger.info("applied %d events so far; %d behind the log (%s)", progress.records,
                            progress.total_lag, _format_lag(progress.lag),
                            extra={"applied": progress.records, "lag": progress.total_lag})
            if self._caught_up(ends):
                if once:
                    break
                stop.wait(self.settings.idle_sleep_s)
                ends = self.log.end_offsets(EVENTS)
                progress.ends = dict(ends)
                self._empty_reads.clear()
            elif not handled and not self._inflight:
                stop.wait(self.settings.idle_sleep_s)
        self._drain()
        progress.next_offsets = self.next_offsets()
        logger.info("projected %d events (%d accepted, %d rejected); lag now %s",
                    progress.records, progress.accepted, progress.rejected,
                    _format_lag(progress.lag))
        return progress

    # -- internals -----------------------------------------------------------------------

    def _fill(self, ends: dict[int, int]) -> None:
        """Read and hand to a decoder until ``pipeline_depth`` batches are in flight."""
        limit = self.settings.empty_reads_before_giving_up
        partitions = sorted(self._writers)
        while len(self._inflight) < max(1, self.settings.pipeline_depth):
            behind = [p for p in partitions
                      if self._cursors[p] < ends.get(p, 0) and self._empty_reads.get(p, 0) < limit]
            if not behind:
                return
            self._turn += 1
            partition = behind[self._turn % len(behind)]
            start = self._cursors[partition]
            records = self.log.read(EVENTS, partition, start, self.settings.batch_size,
                                    self.settings.read_timeout_s)
            if not records:
                # Nothing between the cursor and the end seen: those offsets hold no records
                # (transaction markers), so the stored offset moves over them once the
                # pipeline has applied everything before.
                writer = self._writers[partition]
                if not self._inflight and writer.next_offset == start:
                    writer.skip_to(ends.get(partition, 0))
                    self._cursors[partition] = writer.next_offset
                    continue
                self._empty_reads[partition] = self._empty_reads.get(partition, 0) + 1
                continue
            self._empty_reads[partition] = 0
            decoder = self._decoder_for(len(records))
            decoder.send([r.value for r in records])
            self._inflight.append(_InFlight(partition, start, records, decoder))
            self._cursors[partition] = records[-1].offset + 1

    def _decoder_for(self, size: int) -> InlineDecoder | ProcessDecoder:
        choice = self.settings.decoder
        if choice == "inline" or self._helper_failed or (
                choice == "auto" and size < self.settings.process_decode_min):
            return self._inline
        if self._helper is None:
            self._helper = ProcessDecoder()
        return self._helper

    def _drain(self) -> None:
        """Drop the batches in flight (their decoders' answers are received and discarded)."""
        try:
            while self._inflight:
                self._inflight.popleft().decoder.receive()
        except BackendUnavailable:  # the helper died: start afresh if it is needed again
            self._drop_helper(failed=False)
        self._reset_pipeline()

    def _reset_pipeline(self) -> None:
        """Forget everything in flight; reading starts again at the stored offsets."""
        self._inflight.clear()
        self._inline.close()
        self._cursors = {p: w.next_offset for p, w in self._writers.items()}

    def _drop_helper(self, failed: bool) -> None:
        if self._helper is not None:
            self._helper.close()
            self._helper = None
        self._helper_failed = self._helper_failed or failed

    def _close_writers(self) -> None:
        self._drain()
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        self._cursors.clear()
        self._generation = None

    def _ensure_open(self) -> None:
        if not self._writers:
            self.open()

    def _caught_up(self, ends: dict[int, int]) -> bool:
        if self._inflight:
            return False
        limit = self.settings.empty_reads_before_giving_up
        return all(w.next_offset >= ends.get(p, 0) or self._empty_reads.get(p, 0) >= limit
                   for p, w in self._writers.items())

    def _follow_swap(self) -> None:
        if not self.follow_swaps:
            return
        current = layout.current_generation(self.state_dir)
        if current is not None and self._generation is not None and current != self._generation:
            logger.info("a rebuild swapped in %s: continuing there", current)
            self.open()


def _format_lag(lag: dict[int, int]) -> str:
    return ", ".join(f"p{p}={n}" for p, n in sorted(lag.items())) or "none"


def project(log: EventLog, state_dir: str | os.PathLike[str],
            settings: ProjectorSettings | None = None) -> Progress:
    """Apply everything up to the log's current end, then close (a one-shot projector)."""
    with Projector(log, state_dir, settings) as projector:
        return projector.run(once=True)
