"""Development tools: the Apache Kafka launcher (tools.kafka), Avro's Java implementation (tools.avro)."""
