"""The RocksDB (rocksdict) backend of the projection.

``db`` opens one partition's database, ``writer`` applies batches to it, ``store`` hands
out writers per assigned partition, ``reader`` answers queries, ``layout`` places
generations and partitions on disk, ``snapshot`` encodes the column families, ``digest``
compares projections.
"""
