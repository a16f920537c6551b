"""``python -m benchmarks [--quick]``: run every benchmark (for now: the broker one)."""

from __future__ import annotations

import argparse
import sys

from . import broker

#: name -> (add_arguments, run); each run prints its table and writes results/<name>.json.
SUITES = {"broker": (broker.add_arguments, broker.run)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description="rocketmq-spark benchmarks")
    p.add_argument("--only", choices=sorted(SUITES), action="append",
                   help="run only this benchmark (repeatable; default: all)")
    # Every suite so far is the broker one: its options are the common ones.
    broker.add_arguments(p)
    args = p.parse_args(argv)
    rc = 0
    for name in args.only or list(SUITES):
        rc = max(rc, SUITES[name][1](args))
    return rc


if __name__ == "__main__":
    sys.exit(main())
