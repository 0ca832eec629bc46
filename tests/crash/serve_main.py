"""``effectlog serve`` that stops at one point of its changelog write path, for SIGKILL there.

``--pause-at`` names the point, reached on the ``--pause-on``-th publication of a partition
that carries changes: ``before`` (its states are taken from the store, nothing is produced), ``inside``
(inside the transaction, after the first changelog record was produced, before the commit),
``after`` (the transaction committed, the store not yet told). The process writes
``paused POINT`` on stderr and sleeps until it is killed, or, with ``--release-file``, until
that file exists (then it goes on: a paused owner resuming). Every other argument is
``effectlog``'s own.

    python -m tests.crash.serve_main --pause-at inside --pause-on 2 -- --log URL ... serve ...
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from consumers.node import publisher
from effectlog.log.kafka import changelog

POINTS = ("before", "inside", "after")


RELEASE: list[Path] = []


def pause(point: str) -> None:
    sys.stderr.write(f"paused {point}\n")
    sys.stderr.flush()
    for _ in range(6000):  # SIGKILL lands here (or the release file appears), 10 min at most
        if RELEASE and RELEASE[0].exists():
            sys.stderr.write(f"released {point}\n")
            return
        time.sleep(0.1)


def arm(point: str, on: int) -> None:
    """Patch the publisher and the changelog writer to pause at ``point`` of the ``on``-th
    publication with changes of a partition."""
    original_publish = changelog.KafkaChangelogWriter.publish
    original_produce = changelog.KafkaChangelogWriter._produce

    def publish(self: Any, changes: Any, checkpoint: bytes) -> None:
        self._seen = getattr(self, "_seen", 0) + (1 if changes else 0)
        due = self._seen == on and bool(changes)
        if due and point == "before":
            pause(point)
        self._armed = due and point == "inside"
        original_publish(self, changes, checkpoint)
        if due and point == "after":
            pause(point)

    def produce(self: Any, key: bytes, value: bytes | None) -> None:
        original_produce(self, key, value)
        if getattr(self, "_armed", False):
            self._armed = False
            pause("inside")

    changelog.KafkaChangelogWriter.publish = publish  # type: ignore[method-assign]
    changelog.KafkaChangelogWriter._produce = produce  # type: ignore[method-assign]
    assert publisher.Publisher  # the node's publisher uses the patched writer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pause-at", choices=POINTS, required=True)
    parser.add_argument("--pause-on", type=int, default=2)
    parser.add_argument("--release-file", type=Path, default=None)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.release_file is not None:
        RELEASE.append(args.release_file)
    arm(args.pause_at, args.pause_on)
    from effectlog.cli.entry import main as effectlog

    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    sys.argv = ["effectlog", *rest]
    effectlog()
    return 0


if __name__ == "__main__":
    sys.exit(main())
