"""The Kafka event log: ``kafka://host:9092[,host2:9092]?prefix=effects``, over confluent-kafka.

One module per role: :mod:`.settings` (the URL, parsed once), :mod:`.partitioner` (the Java
client's murmur2), :mod:`.producer` (durable appends: delivery reports, transactions),
:mod:`.reader` (positioned reads and end offsets), :mod:`.admin` (topics), and :mod:`.log`, the
:class:`~effectlog.log.base.EventLog` that puts them together.
"""

from effectlog.log.kafka.admin import create_topics
from effectlog.log.kafka.log import KafkaLog
from effectlog.log.kafka.partitioner import murmur2, murmur2_partition
from effectlog.log.kafka.settings import KafkaSettings

__all__ = ["KafkaLog", "KafkaSettings", "create_topics", "murmur2", "murmur2_partition"]
