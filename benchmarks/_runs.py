"""Running a scenario: the checks that make a figure count (a run that read or wrote the wrong
number of messages must fail, not report a fast rate) and the median of repeated runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["check", "key_value", "median_of"]

T = TypeVar("T")


def check(cond: bool, what: str) -> None:
    """Raise AssertionError("benchmark check failed: <what>") unless ``cond``."""
    if not cond:
        raise AssertionError(f"benchmark check failed: {what}")


def median_of(runs: Sequence[T], key: Callable[[T], float]) -> T:
    """The median run by ``key`` (of an even number, the upper of the two middle ones)."""
    return sorted(runs, key=key)[len(runs) // 2]


def key_value(text: str) -> tuple[str, str]:
    """An argparse type: ``KEY=VALUE`` as (key, value); ArgumentTypeError naming what is accepted."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: accepted: KEY=VALUE")
    return key.strip(), value
