"""Secret scrubbing (``effectlog.redact.scrub_text``) on adversarial input up to 1 MiB.

Every CLI error line and log line is scrubbed, and error lines quote user input, so the
scrubber must be linear in the length of its input. For each family of texts built to make
a backtracking regex quadratic (tests/adversarial_text.py) it times scrub_text at 16 KiB
and 1 MiB, against a raw baseline measured on the same text in the same run: one pass of
a trivial regex (``re.findall("=", text)``).

Printed per family: milliseconds at 1 MiB, the ratio to the baseline, and the growth of the
per-byte cost from 16 KiB to 1 MiB (1.0 is linear; a quadratic scrubber shows about 64).
The last line gives the worst family.

Usage: python bench/redact.py [--runs N]
"""

from __future__ import annotations

import argparse
import re
import statistics

from _common import timed

from effectlog.redact import scrub_text
from tests.adversarial_text import FAMILIES

SMALL, LARGE = 16 * 1024, 1024 * 1024
_BASELINE = re.compile("=")


def measure(text: str, runs: int) -> tuple[float, float]:
    """(median seconds of scrub_text, median seconds of the baseline pass) over ``runs``."""
    scrub = statistics.median(timed(lambda: scrub_text(text)) for _ in range(runs))
    raw = statistics.median(timed(lambda: _BASELINE.findall(text)) for _ in range(runs))
    return scrub, max(raw, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    worst: tuple[float, str, float, float] | None = None
    print(f"{'family':18} {'1 MiB ms':>9} {'x baseline':>11} {'per-byte growth':>16}")
    for name, make in FAMILIES.items():
        small, _ = measure(make(SMALL), args.runs)
        text = make(LARGE)
        large, raw = measure(text, args.runs)
        growth = (large / len(text)) / max(small / len(make(SMALL)), 1e-12)
        print(f"{name:18} {large * 1000:9.1f} {large / raw:11.1f} {growth:16.2f}")
        if worst is None or large > worst[0]:
            worst = (large, name, large / raw, growth)
    assert worst is not None
    seconds, name, ratio, growth = worst
    print(f"redact: worst 1 MiB adversarial input ({name}) {ratio:.1f}x a bare regex pass, "
          f"per-byte cost x{growth:.2f} from 16 KiB to 1 MiB, {seconds * 1000:.0f} ms "
          f"({LARGE / seconds / 1e6:.1f} MB/s)")


if __name__ == "__main__":
    main()
