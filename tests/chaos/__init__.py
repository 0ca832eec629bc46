"""Chaos on Apache Kafka with real processes: serve members killed, rebuilt, joining and
leaving while worker processes race on shared keys against a provider that counts every call
it receives (``python -m tests.chaos.driver --seconds N``, ``make chaos``)."""
