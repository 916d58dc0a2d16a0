"""The ground floor: what the emitter and the Spark consumer both stand on.

The marker protocol (``markers``), settings and CLI value types, Kafka plumbing
(``kafka_clients``, ``list_offsets``, ``kafka_logging``), the Apache Kafka launcher and
its jars, the Java check, process lifecycle, the HTTP server, and the ``slackwater``
command's shell (``cli``). Nothing here imports ``emitter``, ``spark_consumer`` or
``demo`` (tests/pure/test_layout.py).
"""
