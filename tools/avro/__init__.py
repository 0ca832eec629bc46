"""Apache Avro's Java implementation for the interop tests: see tools.avro.interop."""
