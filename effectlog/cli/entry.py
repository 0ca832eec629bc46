"""Console-script entry point.

``effectlog [--state DIR] [--log URL] get KEY --json [--no-catch-up]`` (the read scripts
call most) is answered without importing click, rich or fastavro when the projection is
not behind the embedded log; anything else, a projection that must catch up first, and
any error go through the click CLI in :mod:`effectlog.cli.main`, so output, messages and
exit codes stay the same.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from projections.store import ProjectionReader

_DEFAULT_LOG = "sqlite:///./.effectlog/log.db"
_DEFAULT_STATE = "./.effectlog/state"


def main() -> None:
    """Run the fast ``get --json`` path when it applies, else the full CLI."""
    code = fast_get_json(sys.argv[1:])
    if code is not None:
        _exit_now(code)
    from effectlog.cli.main import main as cli_main

    cli_main()


def fast_get_json(argv: list[str]) -> int | None:
    """Print one snapshot and return 0, or None to let the full CLI handle ``argv``."""
    if os.environ.get("EFFECTLOG_SERVER"):
        return None  # read through a serve instance: the full CLI does that
    options = {"--state": os.environ.get("EFFECTLOG_STATE", _DEFAULT_STATE),
               "--log": os.environ.get("EFFECTLOG_LOG", _DEFAULT_LOG)}
    i = 0
    while i + 1 < len(argv) and argv[i] in options:
        options[argv[i]] = argv[i + 1]
        i += 2
    rest = argv[i:]
    if not (rest[:1] == ["get"] and rest[2:] in (["--json"], ["--json", "--no-catch-up"])
            and not rest[1].startswith("-")):
        return None
    log_url, catch_up = options["--log"], len(rest) == 3
    try:
        from projections import open_reader

        reader = open_reader(options["--state"],
                             families=("state", "offsets", "metadata") if catch_up
                             else ("state",))
        try:
            if catch_up and log_url.startswith("sqlite:") and _behind(log_url, reader):
                return None  # the full CLI catches the projection up first
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


def _exit_now(code: int) -> None:
    """Exit once the answer is out, skipping the interpreter's teardown: with RocksDB loaded
    it costs about as much CPU as everything else ``get --json`` does (bench/project.py)."""
    try:
        sys.stdout.flush()
    except OSError:  # e.g. a closed pipe: the normal exit reports it
        sys.exit(code)
    os._exit(code)


def _behind(log_url: str, reader: ProjectionReader) -> bool:
    """Whether the projection differs from the SQLite log's end (or that is unknown);
    raises where the log is not the one it was built from (the full CLI says so)."""
    from effectlog.cli.freshness import lag

    return lag(log_url, reader.next_offsets(), reader.log_ids(), "the projection") != 0


if __name__ == "__main__":
    main()
