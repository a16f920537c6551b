"""What the broker's operations raise for a request they refuse (answered, never a dropped connection)."""

from __future__ import annotations

__all__ = ["SendRejected"]


class SendRejected(Exception):
    """A send the broker refuses; ``code`` is the remoting response code."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark
