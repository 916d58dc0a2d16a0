"""The one data-loss policy (spark_consumer/source/shared/data_loss.py): failOnDataLoss
true stops in one line naming the topic, partition, offsets and cause; false says it
once and counts; a loss of nothing an answer showed stops only where the old log is gone
whole."""

from __future__ import annotations

import logging

import pytest

from spark_consumer.source.shared import data_loss
from spark_consumer.source.shared.data_loss import Cause, Loss
from spark_consumer.source.shared.options import SourceError, SourceOptions

log = logging.getLogger("test_data_loss")


def _options(fail_on_data_loss: bool) -> SourceOptions:
    return SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "subscribe": "t",
            "failOnDataLoss": str(fail_on_data_loss).lower(),
        }
    )


def test_failondataloss_true_stops_in_one_line_naming_what_was_lost() -> None:
    loss = Loss("t", 3, 10, 100, Cause.DELETED, planned=False)
    with pytest.raises(SourceError) as raised:
        data_loss.report(_options(True), loss, log)
    message = str(raised.value)
    assert "\n" not in message
    assert "t[3] offsets 10 to 99 (90 records, seen only in a log end)" in message
    assert "the topic was deleted" in message
    assert "cannot be counted" in message  # records no answer showed
    assert "failOnDataLoss=false" in message


def test_failondataloss_false_says_it_once_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    loss = Loss("t", 0, 5, 8, Cause.RETENTION, planned=True)
    with caplog.at_level(logging.WARNING, logger=log.name):
        assert data_loss.report(_options(False), loss, log) == 3
    assert [r.getMessage() for r in caplog.records] == [
        "data loss: t[0] offsets 5 to 7 (3 records, planned in a batch) are gone before this "
        "query read them: retention (or DeleteRecords) moved the log start past them; "
        "skipped (failOnDataLoss=false)"
    ]


@pytest.mark.parametrize("cause", [Cause.DELETED, Cause.RETENTION])
def test_nothing_shown_lost_of_a_log_read_to_its_end_is_no_loss(cause: Cause) -> None:
    assert data_loss.report(_options(True), Loss("t", 0, 50, 50, cause, planned=False), log) == 0


@pytest.mark.parametrize("cause", [Cause.RECREATED, Cause.TRUNCATED])
def test_a_log_gone_whole_stops_even_with_nothing_shown_lost(cause: Cause) -> None:
    loss = Loss("t", 0, 50, 50, cause, planned=False)
    with pytest.raises(
        SourceError, match=r"data loss: t\[0\]: .* after this query read to offset 50"
    ):
        data_loss.report(_options(True), loss, log)
    assert data_loss.report(_options(False), loss, log) == 0
