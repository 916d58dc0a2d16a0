"""What Kafka's answers mean (slackwater/kafka_evidence.py): one test per rule of
docs/semantics.md's "Kafka's evidence", named after it, then properties from its text."""

from __future__ import annotations

from types import SimpleNamespace

from confluent_kafka import KafkaError
from hypothesis import given
from hypothesis import strategies as st

from slackwater.kafka_evidence import (
    Gone,
    MissingAnswers,
    fetch_out_of_range,
    known_offset,
    log_end_went_back,
    lower_end,
    missing_topic_event,
    not_answered,
    partition_missing,
    records_gone,
    says_topic_missing,
    topic_missing,
    topic_recreated,
)


def _described(error: int | None = None, partitions: tuple[int, ...] = (0, 1)) -> SimpleNamespace:
    """One topic of a metadata answer, as confluent-kafka's TopicMetadata has it."""
    return SimpleNamespace(
        error=None if error is None else KafkaError(error),
        partitions={p: object() for p in partitions},
    )


# ------------------------------------------------------------ rule 1


def test_rule_1_a_topic_is_missing_only_when_the_broker_says_unknown_topic_or_part() -> None:
    assert says_topic_missing(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    assert topic_missing(_described(KafkaError.UNKNOWN_TOPIC_OR_PART))
    assert topic_missing(None)  # a request naming the topic does not list it
    # A refusal, no leader, a timeout: the topic may well be there.
    for code in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError._TIMED_OUT,
    ):
        assert not says_topic_missing(KafkaError(code))
        assert not topic_missing(_described(code))
    assert not says_topic_missing(None)
    assert not topic_missing(_described())


def test_rule_1_a_partition_is_missing_when_its_topic_is_or_the_topic_has_fewer() -> None:
    assert partition_missing(None, 0)
    assert partition_missing(_described(KafkaError.UNKNOWN_TOPIC_OR_PART), 0)
    assert partition_missing(_described(partitions=(0,)), 1)  # re-created with fewer
    assert not partition_missing(_described(partitions=(0, 1)), 1)
    # Described with another error: its partitions are not known, so not missing.
    assert not partition_missing(_described(KafkaError.LEADER_NOT_AVAILABLE, ()), 1)


def test_rule_1_a_consumers_missing_topic_events_are_the_brokers_and_librdkafkas() -> None:
    for code in (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
    ):
        assert missing_topic_event(KafkaError(code))
    for code in (KafkaError._PARTITION_EOF, KafkaError.TOPIC_AUTHORIZATION_FAILED):
        assert not missing_topic_event(KafkaError(code))


# ------------------------------------------------------------ rule 2


def test_rule_2_a_missing_topic_is_believed_when_told_twice_in_a_row() -> None:
    answers = MissingAnswers()
    assert answers.answer(True) is False  # once: a broker behind on metadata
    assert answers.answer(True) is True


def test_rule_2_an_answer_that_it_is_there_starts_the_count_again() -> None:
    answers = MissingAnswers()
    assert [answers.answer(a) for a in (True, False, True, True)] == [False, False, False, True]


def test_rule_2_no_answer_leaves_the_count_as_it_was() -> None:
    answers = MissingAnswers()
    assert [answers.answer(a) for a in (True, None, True)] == [False, False, True]
    fresh = MissingAnswers()
    assert [fresh.answer(a) for a in (None, None, True)] == [False, False, False]


# ------------------------------------------------------------ rule 3


def test_rule_3_a_lower_log_end_from_a_newer_leader_epoch_went_back() -> None:
    assert log_end_went_back(3, 10, leader_epoch=8, known_leader_epoch=7)  # truncated
    assert not log_end_went_back(10, 10, leader_epoch=8, known_leader_epoch=7)  # nothing new
    assert not log_end_went_back(11, 10, leader_epoch=8, known_leader_epoch=7)  # new records


def test_rule_3_a_lower_log_end_from_the_same_or_an_older_epoch_is_a_stale_leaders() -> None:
    assert lower_end(3, 10)  # looked into, never judged on its own
    assert not log_end_went_back(3, 10, leader_epoch=7, known_leader_epoch=7)
    assert not log_end_went_back(3, 10, leader_epoch=6, known_leader_epoch=7)


def test_rule_3_a_lower_log_end_without_an_epoch_tells_nothing() -> None:
    assert not log_end_went_back(3, 10, leader_epoch=None, known_leader_epoch=7)
    assert not log_end_went_back(3, 10, leader_epoch=8, known_leader_epoch=None)


# ------------------------------------------------------------ rule 4


def test_rule_4_retention_took_the_records_below_the_log_start() -> None:
    assert records_gone(position=5, log_start=8, log_end=20, known_end=20) is Gone.RETENTION


def test_rule_4_a_log_end_at_or_below_the_position_and_below_the_known_end_went_back() -> None:
    assert records_gone(position=5, log_start=0, log_end=5, known_end=20) is Gone.WENT_BACK
    assert records_gone(position=5, log_start=0, log_end=2, known_end=20) is Gone.WENT_BACK


def test_rule_4_records_still_there_ahead_of_the_position_are_not_gone() -> None:
    # The log ends below the known end but past the position: read those first.
    assert records_gone(position=5, log_start=0, log_end=9, known_end=20) is None


def test_rule_4_a_reader_caught_up_with_the_log_loses_nothing() -> None:
    assert records_gone(position=20, log_start=0, log_end=20, known_end=20) is None


# ------------------------------------------------------------ rule 5


def test_rule_5_an_offset_kafka_did_not_give_is_not_an_offset() -> None:
    assert known_offset(0) and known_offset(12)
    for logical in (-1001, -1, -2):  # librdkafka's invalid, end, beginning
        assert not known_offset(logical)


def test_rule_5_an_unknown_log_end_never_went_back_and_loses_nothing() -> None:
    assert not lower_end(-1001, 234)
    assert not log_end_went_back(-1001, 234, leader_epoch=9, known_leader_epoch=1)
    assert records_gone(position=234, log_start=0, log_end=-1001, known_end=300) is None
    assert records_gone(position=234, log_start=-1001, log_end=-1001, known_end=300) is None


# ------------------------------------------------------------ rule 6


def test_rule_6_a_topic_with_another_id_was_recreated() -> None:
    assert topic_recreated("new-id", "old-id")
    assert not topic_recreated("same-id", "same-id")


def test_rule_6_an_unknown_topic_id_tells_nothing() -> None:
    assert not topic_recreated(None, "old-id")
    assert not topic_recreated("new-id", None)


# ------------------------------------------------------------ rule 7


def test_rule_7_only_a_fetch_out_of_range_says_records_may_be_gone() -> None:
    for code in (
        KafkaError.OFFSET_OUT_OF_RANGE,
        KafkaError._AUTO_OFFSET_RESET,
        KafkaError._LOG_TRUNCATION,
    ):
        assert fetch_out_of_range(KafkaError(code))
    for code in (
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError._TRANSPORT,
        KafkaError.UNKNOWN_TOPIC_OR_PART,  # rules 1 and 2 judge that
    ):
        assert not fetch_out_of_range(KafkaError(code))


offsets = st.integers(min_value=0, max_value=1_000)
epochs = st.one_of(st.none(), st.integers(min_value=0, max_value=20))


@given(offsets, offsets, epochs, epochs)
def test_a_log_end_went_back_exactly_when_rule_3_says(
    log_end: int, known_end: int, leader_epoch: int | None, known_leader_epoch: int | None
) -> None:
    """The rule's text as cases: below the known end, and answered in an epoch newer
    than the known one (both given); nothing else."""
    went = log_end_went_back(log_end, known_end, leader_epoch, known_leader_epoch)
    newer = (
        leader_epoch is not None
        and known_leader_epoch is not None
        and leader_epoch > known_leader_epoch
    )
    assert went == (log_end < known_end and newer)


@given(offsets, offsets, offsets, offsets)
def test_a_record_that_is_there_is_never_called_gone(
    position: int, log_start: int, length: int, ahead: int
) -> None:
    """The record at the position exists (log start <= position < log end): whatever
    was seen before, nothing is gone."""
    log_start = min(log_start, position)
    log_end = position + 1 + length
    assert records_gone(position, log_start, log_end, log_end + ahead) is None
    assert records_gone(position, log_start, log_end, position) is None


@given(offsets, offsets, offsets, offsets)
def test_records_are_gone_exactly_when_the_rule_says(
    position: int, log_start: int, log_end: int, known_end: int
) -> None:
    """The rule's text, read as cases: the log start past the position is retention;
    else a log end at or below the position and below the known end went back; else
    the records are there or may still come."""
    log_end = max(log_end, log_start)  # a log never ends before it starts
    gone = records_gone(position, log_start, log_end, known_end)
    if position < log_start:
        assert gone is Gone.RETENTION
    elif log_end <= position and log_end < known_end:
        assert gone is Gone.WENT_BACK
    else:
        assert gone is None


@given(offsets, st.one_of(offsets, st.just(-1001)), st.one_of(offsets, st.just(-1001)), offsets)
def test_an_unknown_answer_never_makes_records_gone(
    position: int, log_start: int, log_end: int, known_end: int
) -> None:
    """Rule 5 over rule 4: with either end unknown, nothing is gone."""
    if log_start < 0 or log_end < 0:
        assert records_gone(position, log_start, log_end, known_end) is None


def test_a_request_not_answered_tells_nothing_and_is_asked_again() -> None:
    for code in (
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_CONTROLLER,
    ):
        assert not_answered(KafkaError(code)), code
    # Answers: the broker refused, or judged the request; asking again changes nothing.
    for code in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.POLICY_VIOLATION,
        KafkaError.INVALID_REPLICATION_FACTOR,
        KafkaError.INVALID_CONFIG,
    ):
        assert not not_answered(KafkaError(code)), code
