"""Console-script entry point.

``effectlog [--state DIR] [--log URL] get KEY --json`` (the read scripts call most) is answered
without importing click, rich or fastavro; anything else, and any error, goes through the click
CLI in :mod:`effectlog.cli.main`, so messages and exit codes stay the same.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Run the fast ``get --json`` path when it applies, else the full CLI."""
    code = fast_get_json(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from effectlog.cli.main import main as cli_main

    cli_main()


def fast_get_json(argv: list[str]) -> int | None:
    """Print one snapshot and return 0, or None to let the full CLI handle ``argv``."""
    if os.environ.get("EFFECTLOG_SERVER"):
        return None  # read through a serve instance: the full CLI does that
    state_dir = os.environ.get("EFFECTLOG_STATE", "./.effectlog/state")
    i = 0
    while i + 1 < len(argv) and argv[i] in ("--state", "--log"):
        if argv[i] == "--state":
            state_dir = argv[i + 1]
        i += 2
    rest = argv[i:]
    if len(rest) != 3 or rest[0] != "get" or rest[2] != "--json" or rest[1].startswith("-"):
        return None
    try:
        from projections import open_reader

        reader = open_reader(state_dir, families=("state",))
        try:
            snapshot = reader.get_json(rest[1])
        finally:
            reader.close()
    except Exception:  # any problem: the full CLI reports it properly
        return None
    if snapshot is None:
        return None
    import json

    sys.stdout.write(json.dumps(snapshot, sort_keys=True, default=str) + "\n")
    return 0
