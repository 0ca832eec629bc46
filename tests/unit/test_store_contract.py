"""The RocksDB store passes the projection store contract."""

from __future__ import annotations

from pathlib import Path

from projections.rocksdb.store import RocksProjectionStore
from projections.testing import ProjectionStoreContract


class TestRocksProjectionStore(ProjectionStoreContract):
    def make_store(self, path: Path) -> RocksProjectionStore:
        return RocksProjectionStore(path)
