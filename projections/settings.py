"""How a projector is tuned and what it reports: its settings, its progress, its callbacks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

DecoderChoice = Literal["auto", "inline", "process"]
#: Called after each applied batch with (partition, next offset): every record below it
#: has been applied (offsets that hold no records included).
AppliedCallback = Callable[[int, int], None]


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
    empty_reads_before_giving_up: int = 3
    decoder: DecoderChoice = "auto"
    process_decode_min: int = 1000
    pipeline_depth: int = 2
    log_every_s: float = 10.0
    #: Apply past a gap compaction may have made (:mod:`projections.compaction_guard`),
    #: logging it, instead of halting the partition there.
    accept_compaction_gaps: bool = False


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

    @property
    def lag_text(self) -> str:
        """The lag as ``p0=N, p1=M`` (``none`` without partitions)."""
        return ", ".join(f"p{p}={n}" for p, n in sorted(self.lag.items())) or "none"


ProgressCallback = Callable[[Progress], None]
