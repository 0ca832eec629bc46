"""RocksDB projection of the effect log and its read-side queries."""
