"""Development tools: the Apache Kafka launcher (tools.kafka)."""
