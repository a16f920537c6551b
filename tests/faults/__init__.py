"""Fault tools for the fault-injection suite (issue 29): a fault-injecting TCP proxy
(:mod:`.proxy`), brokers in their own network namespace (:mod:`.netns`) and signals to
processes and their children (:mod:`.procs`).

Imported as ``faults`` under pytest (tests/ is on sys.path there) and as ``tests.faults`` by
``python -m tests.faults`` at the repository root; modules here import each other relatively,
and tests/ is put on sys.path so both ways reach the suite's shared modules (``brokers``,
``real_rocketmq``) under one name.
"""

from __future__ import annotations

import os
import sys

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:
    sys.path.append(_TESTS)  # after site-packages: a test module never shadows a library
