"""``python -m tests.faults run [options]`` at the repository root: the fault-injection suite's
long version (pytest runs a short bounded one, tests/faults/test_suite.py).

    python -m tests.faults run --brokers embedded,real --minutes 10 --seed 7 \\
        --faults kill-driver,pause-broker,partition --out fault-results

For each broker kind it prints the table and writes ``<out>/faults-<broker>.json`` (the run's
logs, send log, events and outputs stay under ``<out>/run-<broker>-seed<seed>/``). Exit status
0 when every run passed, 1 when one found a loss, a forbidden duplicate or reordering, 2 on
bad arguments. ``python -m tests.faults list`` lists the fault kinds; ``python -m tests.faults check
<out>/run-<broker>-seed<seed>`` judges a run again from what it kept.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
from pathlib import Path

from real_rocketmq import VERSION

from .nemesis import FAULTS
from .suite import DEFAULT_FAULTS, SuiteConfig, check_workdir, output_lines, run_suite, verdict


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. subscribePattern=FaultsA")
    return key.strip(), value


def _pair(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    try:
        pair = (float(lo), float(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MIN,MAX seconds") from None
    if pair[0] < 0 or pair[1] < pair[0]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 <= MIN <= MAX")
    return pair


def _faults(text: str) -> tuple[str, ...]:
    if text == "all":
        return tuple(FAULTS)
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown fault kinds {unknown}; known: {', '.join(FAULTS)}, or all")
    return kinds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the fault kinds")
    c = sub.add_parser("check", help="judge a run again from what it kept (its send log, read-back and wipes)")
    c.add_argument("workdir", type=Path, help="a run's directory, <out>/run-<broker>-seed<seed>")
    r = sub.add_parser("run", help="run the suite")
    r.add_argument("--brokers", default="embedded,real",
                   help=f"comma-separated broker kinds: embedded, real (Apache RocketMQ {VERSION}) (default both)")
    r.add_argument("--minutes", type=float, default=5.0, help="minutes of faults per broker (default 5)")
    r.add_argument("--seed", type=int, default=None, help="random seed of the schedule (default: a random one, "
                                                          "printed)")
    r.add_argument("--faults", type=_faults, default=DEFAULT_FAULTS,
                   help=f"comma-separated fault kinds, or all (default: all): {', '.join(FAULTS)}")
    r.add_argument("--concurrency", type=int, default=1,
                   help="faults at once (default 1: each alone); 2: Spark-side faults (driver, workers) in one lane "
                        "and cluster-side ones (brokers, name server, network) in another, mixed; more: more "
                        "cluster-side lanes, whose choices then also depend on timing")
    r.add_argument("--rate", type=float, default=200.0, help="messages per second (default 200)")
    r.add_argument("--queues", type=int, default=2, help="queues per broker of topic A (default 2)")
    r.add_argument("--hold", type=_pair, default=(3.0, 10.0), metavar="MIN,MAX",
                   help="seconds a fault holds (default 3,10)")
    r.add_argument("--gap", type=_pair, default=(2.0, 6.0), metavar="MIN,MAX",
                   help="seconds between two faults (default 2,6)")
    r.add_argument("--no-netns", action="store_true", help="keep broker-b out of a network namespace "
                                                           "(the partition fault is then skipped)")
    r.add_argument("--out", type=Path, default=Path("fault-results"), help="output directory (default "
                                                                            "./fault-results)")
    r.add_argument("--release", default=None, metavar="X.Y.Z",
                   help=f"the Apache RocketMQ release of broker kind real (default {VERSION}), fetched from Maven "
                        "Central on first use")
    r.add_argument("--reader-option", action="append", type=_option, default=[], metavar="KEY=VALUE",
                   help="one more option of the queries' reader (repeatable), e.g. subscribePattern=FaultsA or "
                        "minMessagesPerTrigger=50; a subscribePattern replaces the option topic")
    r.add_argument("-v", "--verbose", action="store_true", help="log every event as it happens")
    args = p.parse_args(argv)
    if args.command == "list":
        width = max(map(len, FAULTS))
        for f in FAULTS.values():
            print(f"{f.name:<{width}}  {f.help}")
        return 0
    if args.command == "check":
        outputs = check_workdir(args.workdir)
        failures = verdict(outputs)
        print("\n".join(output_lines({name: r.summary() for name, r in outputs.items()})))
        print("verdict:", "FAIL" if failures else "PASS")
        for f in failures:
            print(f"  - {f}")
        return 1 if failures else 0
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    for b in brokers:
        if b not in ("embedded", "real"):
            p.error(f"--brokers: unknown broker kind {b!r}; expected embedded and/or real")
    if args.concurrency < 1:
        p.error("--concurrency must be >= 1")
    print(f"fault suite: seed {seed}, brokers {', '.join(brokers)}, {args.minutes:g} min of faults each", flush=True)
    ok = True
    for broker in brokers:
        cfg = SuiteConfig(broker=broker, seed=seed, minutes=args.minutes, faults=args.faults, out=args.out,
                          rate=args.rate, queues=args.queues, out_queues=args.queues, concurrency=args.concurrency,
                          hold_s=args.hold, gap_s=args.gap, use_netns=not args.no_netns,
                          release=args.release, reader_options=tuple(args.reader_option))
        result = run_suite(cfg)
        print(result.table, flush=True)
        print(f"results written to {args.out / f'faults-{broker}.json'}\n", flush=True)
        ok = ok and result.ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
