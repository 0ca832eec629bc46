"""A changelog read that fences nobody (a standby copy, ``rebuild``, ``project``) follows the
end while publications go on, so a key whose record the cleaner removed ahead of the reader
(a later publication of it exists) is still read: from the later publication."""

from __future__ import annotations

from collections.abc import Iterator

from effectlog.log.changelog import CHECKPOINT_KEY, Change, read_to_settled_end


class Publishing:
    """A changelog partition as offsets -> records, which the owner keeps publishing to
    and the cleaner keeps thinning, while a reader reads it."""

    def __init__(self) -> None:
        self.records: dict[int, Change] = {0: (b"k", b"v1"), 1: (b"j", b"w1"),
                                           2: (CHECKPOINT_KEY, b"c1")}
        self.reads = 0

    def end(self) -> int:
        return max(self.records) + 1

    def read(self, start: int, stop: int) -> Iterator[Change]:
        self.reads += 1
        if self.reads == 1:
            # the owner publishes k again, and the cleaner removes k's first record before
            # the reader gets to it
            self.records.update({3: (b"k", b"v2"), 4: (CHECKPOINT_KEY, b"c2")})
            del self.records[0]
        for offset in range(start, stop):
            if offset in self.records:
                yield self.records[offset]


def test_a_key_removed_ahead_of_the_reader_is_read_from_its_later_publication() -> None:
    log = Publishing()
    read = list(read_to_settled_end(log.end, log.read))
    assert (b"k", b"v2") in read and read[-1] == (CHECKPOINT_KEY, b"c2")
    stopped_at_the_first_end = [c for offset, c in sorted(log.records.items()) if offset < 3]
    assert b"k" not in {key for key, _ in stopped_at_the_first_end}  # what it used to miss


def test_the_read_stops_after_a_bounded_number_of_rounds() -> None:
    ends = iter(range(1, 10_000))
    read = list(read_to_settled_end(lambda: next(ends), lambda a, b: iter([(b"x", b"y")] * (b - a)),
                                    rounds=5))
    assert len(read) == 5
