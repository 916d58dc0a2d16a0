"""``slackwater consume``: windowed aggregates of Kafka topics, an application on the
slackwater source (``spark_consumer.source``), with its own configuration, job and
metrics."""
