"""``format("rocketmq")``: the stream and batch readers.

Spark-facing methods (camelCase) are thin; the planning is plain Python in
:class:`~.planning.Planner`, tested without Spark. Planning calls run in one long-lived
process on the driver side; ``read()`` runs in executors on an unpickled copy (the pull
loop, :mod:`.pull_loop`), so nothing here opens a socket in ``__init__``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    Filter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ..client import BrokerClient
from ..errors import (
    OptionError,
)
from ..model import MessageQueue
from ..offsets import (
    EARLIEST,
    LATEST,
    RESET_KEY,
    Offsets,
    batch_end_json,
    group_of,
    marks_of,
    split_batch_end,
)
from .options import ReaderOptions
from .packing import PackedRanges, pack
from .planning import Planner, QueueOffsets
from .pushdown import Pushed, pushed_of
from .queue_range import QueueRange

log = logging.getLogger(__name__)

__all__ = ["Planner", "QueueRange", "RocketMQBatchReader", "RocketMQStreamReader"]

def _to_json(offsets: QueueOffsets) -> dict[str, dict[str, int]]:
    """Offsets as Spark keeps them in its checkpoint (the canonical form, see :mod:`..offsets`)."""
    return Offsets(offsets).to_json()


class RocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("rocketmq")``. Offsets cross Spark as the offsets JSON form
    (:mod:`rocketmq_spark.offsets`: next-offsets); a batch that follows an offset reset also
    names the queues it reads from the reset offset (``"@reset"``). Everything but :meth:`read`
    runs in the driver-side planning process, one call at a time; :meth:`read` runs in executors."""

    def __init__(self, options: ReaderOptions) -> None:
        self.planner = Planner(options)

    def _started(self) -> None:
        """Checks the group once (:meth:`Planner.check_group`: GroupInUseError,
        GroupNotFoundError), then joins it as an online consumer (:meth:`Planner.join_group`)."""
        self.planner.check_group()
        self.planner.join_group()

    def initialOffset(self) -> dict:
        """Where a query without a checkpoint starts: every queue's first offset to read
        (startingTimestamp, startingOffsets, or the group's committed offsets with
        consumeFromWhere). A down broker is waited for; BrokerUnavailableError past
        brokerDownTimeoutMs; TopicNotFoundError for a topic without a route."""
        self._started()
        return _to_json(self.planner.initial())

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.planner.options.max_messages_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next batch from ``start``. Resets of the group's offsets seen since the
        last batch are applied to its start (onOffsetReset; OffsetResetError with fail). Spark
        calls it once the batch ending at ``start`` is done, so ``start``'s offsets then go to the
        brokers as the group's (:meth:`Planner.processed`: exact at every trigger, idle ones
        included; a write a broker ignores for a waiting reset is that reset, applied too). Then
        each queue's latest offset now, capped by ``limit`` (messages shared across queues by
        backlog) and, under AvailableNow, by the target
        :meth:`prepareForTriggerAvailableNow` fixed; a new queue starts at its min offset, kept in
        the batch's offsets. The planned ranges are registered for :meth:`commit`. A start below the queue's min offset
        raises DataLossError (failOnDataLoss=false: skipped, logged). Queues of a down broker
        keep their offset; BrokerUnavailableError past brokerDownTimeoutMs."""
        self._started()
        ends = self.planner.reading(dict(split_batch_end(start)[0]))
        self.planner.adopt_marks(marks_of(start))
        self.planner.adopt_group(group_of(start))
        self.planner.find_resets(ends)
        restarted = self.planner.follow_resets(ends)
        begin = self.planner.check_data_loss({**ends, **restarted})
        # the batch ending at `start` is done: its offsets go to the brokers, but for the queues
        # read again from a reset offset or from a lost store's first message
        if self.planner.processed({mq: off for mq, off in ends.items() if mq not in restarted}):
            # a broker ignored a write: a server-side reset waits for the group's next pull, which
            # this batch's tasks would make. The batch follows it instead
            more = self.planner.follow_resets(ends)
            restarted.update(more)
            begin = self.planner.check_data_loss({**begin, **more})
        end = self.planner.next_end(begin, limit)
        starts = {mq: begin[mq] for mq in restarted if mq in begin}
        restarts = self.planner.take_restarts()
        starts.update(restarts)
        starts.update(self.planner.take_new_starts())  # a replay reads them from there too
        if not starts and end == ends:
            # nothing new: the offsets as they were (Spark plans no batch). The starts of the batch
            # that ended there are that batch's alone: offsets that differ by them only are given
            # back unchanged; a queue gone (a deleted topic) or a mark taken since still make a
            # batch, empty, that writes them to the checkpoint
            same = batch_end_json(end, {}, self.planner.marks_of(end), group_of(start))
            return start if {k: v for k, v in start.items() if k != RESET_KEY} == same else same
        at = self.planner.group_at_planning(ends, end, set(restarted) | set(restarts))
        return batch_end_json(end, starts, self.planner.marks_of(end), at)

    def reportLatestOffset(self) -> dict | None:
        """Every queue's max offset (one past its last message), for Spark's progress: as the
        planning of this trigger found them a moment ago (:meth:`Planner.recent_latest`: the
        brokers are not asked twice); queues of brokers that do not answer are left out."""
        return _to_json(self.planner.recent_latest())

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.target = self.planner.latest()

    def partitions(self, start: dict, end: dict) -> list[QueueRange | PackedRanges]:
        """The batch ``[start, end)`` as :class:`QueueRange` partitions (:meth:`Planner.partitions`),
        packed into fewer when the batch is small (:mod:`.packing`); a queue the batch reads from a
        reset offset starts there."""
        begin = dict(split_batch_end(start)[0])
        ends, restarted = split_batch_end(end)
        begin.update(restarted)
        # the marks the batch was planned with (a replayed batch's too, from Spark's offset log)
        return _packed(self.planner.options, self.planner.partitions(begin, dict(ends), marks_of(end)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor side: the partition's rows (:func:`~.pull_loop.read_range`, which says what it
        raises)."""
        from .pull_loop import _read_partition  # the decoders: the executors' (the driver plans only)

        return _read_partition(partition)

    def commit(self, end: dict) -> None:
        """Spark finished the batches up to ``end``: the group's offsets follow
        (:meth:`Planner.commit`; broker faults are logged, not raised)."""
        self.planner.commit(dict(split_batch_end(end)[0]))

    def stop(self) -> None:
        """The query stops: leave the consumer group (the brokers stop listing it)."""
        self.planner.leave_group()


def _packed(o: ReaderOptions, ranges: list[QueueRange]) -> list[QueueRange | PackedRanges]:
    """A batch's ranges packed into fewer partitions when it is small (see :mod:`.packing`)."""
    return pack(ranges, o.min_messages_per_partition, o.min_partitions or 1, o.max_records_per_partition)


def _time_bounds(client: BrokerClient, start: QueueOffsets, end: QueueOffsets, pushed: Pushed
                 ) -> tuple[QueueOffsets, QueueOffsets]:
    """Each queue's ``[start, end)`` narrowed to the messages the store-time window can hold:
    from the first offset stored at or after its start, to one past the first stored at or
    after its end (one more than needed: a broker that answers the last offset, not the max,
    for a time past it loses nothing). Queues left empty drop out."""
    lo: QueueOffsets = {}
    hi: QueueOffsets = {}
    for mq in start:
        if start[mq] >= end[mq]:
            continue
        a = start[mq] if pushed.time_lo is None else max(start[mq], client.search_offset(mq, pushed.time_lo))
        b = end[mq] if pushed.time_hi is None else min(end[mq], client.search_offset(mq, pushed.time_hi) + 1)
        if a < b:
            lo[mq], hi[mq] = a, b
    return lo, hi


def _ends_at_times(client: BrokerClient, start: QueueOffsets, end: QueueOffsets, times: Mapping[MessageQueue, int]
                   ) -> QueueOffsets:
    """endingOffsetsByTimestamp: each queue it names up to (not including) its first message
    stored at or after its time; to its end when there is none."""
    out = dict(end)
    for mq, ts in times.items():
        if mq in out:
            out[mq] = min(out[mq], max(start.get(mq, 0), client.search_offset(mq, ts)))
    return out


def _check_ending(given: QueueOffsets, start: QueueOffsets, latest: QueueOffsets) -> None:
    """endingOffsets must lie within each queue's range: past its end nothing is lost, the
    request is wrong; say so at planning time rather than fail reading."""
    for mq, off in sorted(given.items()):
        if off in (LATEST, EARLIEST) or mq not in latest:
            continue
        lo = start.get(mq, 0)
        if off > latest[mq] or off < lo:
            raise OptionError("endingOffsets", f"{mq.key}: {off}",
                              f"{mq} holds offsets [{lo}, {latest[mq]}) to read from here (its next message will "
                              f"be offset {latest[mq]}): accepted: an offset in {lo}..{latest[mq]}, -1 (latest) "
                              "or -2 (earliest)")


class RocketMQBatchReader(DataSourceReader):
    """``spark.read.format("rocketmq")``: one batch from the stream's initial offsets (after
    the data-loss check) to endingOffsets or every queue's max offset now. It does not check
    the consumer group for other consumers, nor commit its offsets."""

    def __init__(self, options: ReaderOptions) -> None:
        self.options = options
        self.pushed = Pushed()

    def partitions(self) -> list[QueueRange | PackedRanges]:
        """Plans on the driver with a client of its own, closed after. Raises as
        :meth:`RocketMQStreamReader.initialOffset` does (without the group check), DataLossError
        for starts deleted by retention, OptionError for endingOffsets outside a queue's range.
        Pushed filters and endingTimestamp narrow the queues, tags and offsets read."""
        o, pushed = self.options, self.pushed
        if o.ending_timestamp is not None:
            hi = o.ending_timestamp if pushed.time_hi is None else min(pushed.time_hi, o.ending_timestamp)
            pushed = replace(pushed, time_hi=hi)
        sub = pushed.sub_expression(o.sub_expression, o.sub_type)
        if pushed.nothing or not sub:
            return []
        planner = Planner(replace(o, sub_expression=sub))
        planner.keep = pushed.keeps
        try:
            start = planner.check_data_loss(planner.initial())
            latest = planner.latest_of(start)
            if o.ending == "json":
                given = dict(o.ending_json or {})
                end = {mq: (latest[mq] if given.get(mq, LATEST) == LATEST else given[mq]) for mq in latest}
                _check_ending(given, start, latest)
            else:
                end = latest
            if o.ending_by_timestamp and o.ending_timestamp is None:
                end = _ends_at_times(planner.client, start, end, o.ending_by_timestamp)
            if pushed.time_lo is not None or pushed.time_hi is not None:
                start, end = _time_bounds(planner.client, start, end, pushed)
            return _packed(o, planner.partitions(start, end))
        finally:
            planner.client.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor side: the partition's rows (:func:`~.pull_loop.read_range`)."""
        from .pull_loop import _read_partition

        return _read_partition(partition)


class RocketMQPushdownBatchReader(RocketMQBatchReader):
    """The batch reader with filterPushdown=true: it takes the filters Spark pushes down
    (which needs spark.sql.python.filterPushdown.enabled=true; Spark refuses a reader that
    implements pushFilters without it, so the plain reader does not)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Spark's filters on the rows (their AND), kept to read less (see
        :mod:`rocketmq_spark.source.pushdown`): a storeTimestamp window, tags, topics, brokers,
        queue ids. All are given back: Spark evaluates each on the rows read, so what a query
        returns never depends on this."""
        self.pushed = pushed_of(filters)
        return filters
