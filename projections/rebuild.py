"""Rebuild the projection from the log into a new generation, then swap it in atomically."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

from effectlog.log.base import EventLog
from projections.projector import ProgressCallback, Projector, ProjectorSettings
from projections.rocksdb import layout

logger = logging.getLogger(__name__)


def rebuild(log: EventLog, state_dir: str | os.PathLike[str],
            settings: ProjectorSettings | None = None, *,
            on_progress: ProgressCallback | None = None,
            stop: threading.Event | None = None) -> Path | None:
    """Project the whole log (up to its end at the start) into ``<state_dir>.new-<ms>`` and
    swap it in; returns the new generation, or None when stopped before the end (the
    partial build is removed and the current projection stays). A second rebuild of the
    same ``state_dir`` while one runs, or one next to a running serve, raises
    :class:`BackendUnavailable` at once.

    The new generation records the identity of ``log``: this is how a projection adopts
    a new log (see :mod:`projections.lineage`). The state directory is held for the whole
    rebuild (:func:`~projections.rocksdb.layout.hold`): a running ``effectlog serve`` refuses
    it, so no answer ever mixes two generations. A ``state_dir`` that is not a projection
    raises :class:`~projections.rocksdb.layout.NotAProjection` before anything is made."""
    held = layout.hold(state_dir, "effectlog rebuild")
    try:
        built = layout.new_build_dir(state_dir)
        try:
            with Projector(log, built, settings, follow_swaps=False) as projector:
                progress = projector.run(once=True, stop=stop, on_progress=on_progress)
                complete = not (stop is not None and stop.is_set()) or progress.total_lag == 0
        except BaseException:
            shutil.rmtree(built, ignore_errors=True)
            raise
        if not complete:
            shutil.rmtree(built, ignore_errors=True)
            logger.warning("rebuild stopped before the end; %s is unchanged", state_dir)
            return None
        try:
            final = layout.swap_in(state_dir, built)
        except layout.NotAProjection:  # something else took the state's place meanwhile
            shutil.rmtree(built, ignore_errors=True)
            raise
    finally:
        held.close()
    logger.info("rebuilt projection swapped in: %s -> %s", state_dir, final)
    return final
