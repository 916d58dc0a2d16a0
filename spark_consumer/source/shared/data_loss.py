"""One data-loss policy for the whole source, in the shape of Spark's ``reportDataLoss``
(KafkaMicroBatchStream): every place that finds records gone, the planner as the
readers, calls ``report`` with what was lost, and the option failOnDataLoss alone says
what follows.

    failOnDataLoss=true   the query stops, one line naming the topic, partition,
                          offsets and cause
    failOnDataLoss=false  one warning line, and the records counted (``records_lost``)

Records are counted only where some answer showed them: a range planned, or a log end
the planner read. Records written after the last answer this side saw, and gone before
another, no answer ever showed; the message says so rather than claim a count it
cannot know.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from spark_consumer.source.shared.options import SourceError, SourceOptions


class Cause(enum.Enum):
    """Why records are gone (``slackwater.kafka_evidence`` rules 4, 6 and 3)."""

    RETENTION = "retention (or DeleteRecords) moved the log start past them"
    DELETED = "the topic was deleted (or re-created with fewer partitions)"
    RECREATED = "the topic was deleted and re-created under its name"
    TRUNCATED = "the log was truncated by an unclean leader election"


@dataclass(frozen=True)
class Loss:
    """Offsets ``[first, end)`` of one partition gone before this query read them."""

    topic: str
    partition: int
    first: int
    end: int
    cause: Cause
    # True: they were in a batch Spark planned (a reader found them gone); False: only
    # a log end the planner read showed them.
    planned: bool

    @property
    def records(self) -> int:
        return max(0, self.end - self.first)

    @property
    def unseen_possible(self) -> bool:
        """Whether records no answer showed may be gone too: the old log is gone whole
        (re-created, or truncated below where this query read), so records written to it
        after the last answer seen went with it, and a log read again from its start may
        hold other records at offsets this query read."""
        return self.cause in (Cause.RECREATED, Cause.TRUNCATED)

    def describe(self) -> str:
        where = f"{self.topic}[{self.partition}]"
        if self.records == 0:
            return f"{where}: {self.cause.value} after this query read to offset {self.first}"
        shown = "planned in a batch" if self.planned else "seen only in a log end"
        return (
            f"{where} offsets {self.first} to {self.end - 1} ({self.records} records, "
            f"{shown}) are gone before this query read them: {self.cause.value}"
        )


def report(options: SourceOptions, loss: Loss, logger: logging.Logger) -> int:
    """failOnDataLoss=true: raises one ``SourceError`` naming the loss. false: says it
    once and returns how many records to count in ``records_lost``. A loss of no record
    an answer showed is one only where records no answer showed may be gone too
    (``Loss.unseen_possible``): a deleted topic read to its end loses nothing."""
    if loss.records == 0 and not loss.unseen_possible:
        return 0
    unseen = (
        "; any written after the last log end this query saw cannot be counted"
        if not loss.planned
        else ""
    )
    if options.fail_on_data_loss:
        raise SourceError(
            f"data loss: {loss.describe()}{unseen}; the option failOnDataLoss=false goes "
            "on past them, counting them in records_lost"
        )
    logger.warning("data loss: %s%s; skipped (failOnDataLoss=false)", loss.describe(), unseen)
    return loss.records
