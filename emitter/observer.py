"""Reads the broker's view of the watched partitions through the Admin API.

One request per kind per poll, never one per partition (DESIGN §4): topic
metadata, ListOffsets(latest) for every watched partition at once, and, with
a group, its committed offsets and its members' assignment. A failed request
leaves its part of the :class:`BrokerView` empty; it never invents values.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

log = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]


@dataclass
class BrokerView:
    """What one poll read from the broker; None / empty where a request failed."""

    topics: dict[str, int] | None = None
    log_end_offsets: dict[TopicPartitionKey, int] = field(default_factory=dict)
    committed_offsets: dict[TopicPartitionKey, int] | None = None
    assignment: dict[str, list[TopicPartitionKey]] | None = None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def reachable(self) -> bool:
        return self.topics is not None


class BrokerObserver:
    """Thin wrapper over AdminClient: every call bounded by ``request_timeout_s``."""

    def __init__(self, admin: AdminClient, request_timeout_s: float) -> None:
        self._admin = admin
        self._timeout_s = request_timeout_s

    def observe(self, topics: Iterable[str], group: str | None) -> BrokerView:
        view = BrokerView()
        watched = list(topics)
        try:
            metadata = self._admin.list_topics(timeout=self._timeout_s)
        except KafkaException as error:
            view.errors["metadata"] = str(error.args[0] if error.args else error)
            return view  # without metadata nothing else is trustworthy this poll
        view.topics = {}
        for name in watched:
            topic = metadata.topics.get(name)
            if topic is not None and topic.error is None:
                view.topics[name] = len(topic.partitions)
        partitions = [
            TopicPartition(name, index)
            for name, count in view.topics.items()
            for index in range(count)
        ]
        if not partitions:
            return view
        view.log_end_offsets = self._log_end_offsets(partitions, view.errors)
        if group is not None:
            view.committed_offsets = self._committed_offsets(group, partitions, view.errors)
            view.assignment = self._assignment(group, view.errors)
        return view

    def _log_end_offsets(
        self, partitions: list[TopicPartition], errors: dict[str, str]
    ) -> dict[TopicPartitionKey, int]:
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        request = {tp: latest for tp in partitions}
        offsets: dict[TopicPartitionKey, int] = {}
        try:
            futures = self._admin.list_offsets(request, request_timeout=self._timeout_s)
        except KafkaException as error:
            errors["list_offsets"] = str(error)
            return offsets
        failures = 0
        for tp, future in futures.items():
            result = _result(future, self._timeout_s)
            if isinstance(result, BaseException):
                failures += 1
                errors["list_offsets"] = str(result)
            else:
                offsets[(tp.topic, tp.partition)] = int(result.offset)
        if failures:
            log.warning("log end offsets of %d partitions could not be read", failures)
        return offsets

    def _committed_offsets(
        self, group: str, partitions: list[TopicPartition], errors: dict[str, str]
    ) -> dict[TopicPartitionKey, int] | None:
        request = [ConsumerGroupTopicPartitions(group, partitions)]
        try:
            futures = self._admin.list_consumer_group_offsets(
                request, request_timeout=self._timeout_s
            )
        except KafkaException as error:
            errors["group_offsets"] = str(error)
            return None
        result = _result(futures[group], self._timeout_s)
        if isinstance(result, BaseException):
            errors["group_offsets"] = str(result)
            return None
        return {
            (tp.topic, tp.partition): int(tp.offset)
            for tp in result.topic_partitions
            if tp.error is None and tp.offset >= 0
        }

    def _assignment(
        self, group: str, errors: dict[str, str]
    ) -> dict[str, list[TopicPartitionKey]] | None:
        try:
            futures = self._admin.describe_consumer_groups([group], request_timeout=self._timeout_s)
        except KafkaException as error:
            errors["describe_group"] = str(error)
            return None
        result = _result(futures[group], self._timeout_s)
        if isinstance(result, BaseException):
            errors["describe_group"] = str(result)
            return None
        assignment: dict[str, list[TopicPartitionKey]] = {}
        for member in result.members:
            owned = member.assignment.topic_partitions if member.assignment else []
            assignment[member.member_id] = [(tp.topic, tp.partition) for tp in owned]
        return assignment


def _result(future: Future[Any], timeout_s: float) -> Any:
    """The future's result, or the exception it failed with (timeouts included)."""
    try:
        return future.result(timeout=timeout_s)
    except BaseException as error:
        return error
