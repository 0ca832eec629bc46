"""Apache Kafka from Maven Central jars, without Docker: see tools.kafka.broker."""
