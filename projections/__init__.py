"""RocksDB projection of the effect log and its read-side queries.

``open_reader(state_dir)`` is the one way in for readers; the projector lives in
:mod:`projections.projector`, the ports in :mod:`projections.store`, the RocksDB backend
in :mod:`projections.rocksdb`. Submodules are imported lazily so that a one-shot reader
(``effectlog get``) loads only what it uses.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from projections.rocksdb.reader import RocksProjectionReader


def open_reader(state_dir: str | os.PathLike[str],
                mode: Literal["read_only", "secondary"] = "read_only",
                families: tuple[str, ...] | None = None) -> RocksProjectionReader:
    """A reader of the projection under ``state_dir``, safe next to a running projector.

    ``read_only`` gives a static view as of opening (right for one-shot commands);
    ``secondary`` follows the projector through :meth:`~ProjectionReader.refresh`.
    ``families`` opens only those column families (default: all). A missing projection
    opens as an empty reader (``exists`` is False).
    """
    from projections.rocksdb.db import COLUMN_FAMILIES
    from projections.rocksdb.reader import RocksProjectionReader

    return RocksProjectionReader(state_dir, mode, families or COLUMN_FAMILIES)
