"""The many-queue forms of the per-queue offset calls, one call after another.

The planner asks every queue's min/max offset each trigger and the offset store writes every
queue's offset each commit; the remoting client pipelines those requests (see
``RemotingClient._mq_calls``). Clients that do not (the gRPC one, test fakes) get these
sequential forms from this mixin, built on their per-queue calls."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import RocketMQSparkError
from ..model import MessageQueue


class SequentialManyQueueCalls:
    def max_offset(self, mq: MessageQueue) -> int:
        raise NotImplementedError

    def min_offset(self, mq: MessageQueue) -> int:
        raise NotImplementedError

    def query_consumer_offset(self, group: str, mq: MessageQueue) -> int | None:
        raise NotImplementedError

    def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        raise NotImplementedError

    def offset_ranges(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, tuple[int, int]]:
        return {mq: (self.min_offset(mq), self.max_offset(mq)) for mq in mqs}

    def max_offsets(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, int]:
        return {mq: self.max_offset(mq) for mq in mqs}

    def min_offsets(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, int]:
        return {mq: self.min_offset(mq) for mq in mqs}

    def query_consumer_offsets(self, group: str, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, int | None]:
        return {mq: self.query_consumer_offset(group, mq) for mq in mqs}

    def update_consumer_offsets(self, group: str, offsets: dict[MessageQueue, int]
                                ) -> dict[MessageQueue, RocketMQSparkError]:
        """Every queue's offset; the failures are returned (queue -> error), not raised."""
        failed: dict[MessageQueue, RocketMQSparkError] = {}
        for mq, off in offsets.items():
            try:
                self.update_consumer_offset(group, mq, off)
            except RocketMQSparkError as exc:
                failed[mq] = exc
        return failed
