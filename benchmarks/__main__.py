"""``python -m benchmarks [--quick] [--only NAME] [--results-dir DIR] [suite options]``: run the
benchmark suites.

Each suite prints its table and writes ``<results-dir>/<name>.json`` and ``<name>.png``
(``<name>-quick.*`` with ``--quick``; the default directory is benchmarks/results)::

    source / sink   spark_io       RocketMQ -> Spark vs a synthetic Arrow source and a plain client
                                   loop; Spark -> RocketMQ at-least-once and exactly-once
    client          client_decode  pull + decode vs the same bytes from a socket; decode alone
    broker          broker         append single/batched, sync vs async flush; pulls
    scale           scale          planning + commit for 8..4096 queues; executor peak memory
    peers           peers          the official RocketMQ 5 SDK vs our writer and reader (gRPC)
    cluster         cluster        two brokers, one killed: write, planning and read figures

``--quick`` is a smoke run (CI runs it from tests/test_benchmarks_smoke.py and checks that every
result and plot is written, never how fast); to stay under a minute it runs spark_io in a child
process beside the other suites, so its figures are not for comparison.

Every suite has its own options (its ``add_arguments``): each one parses the command line with
its own parser, so two suites may use the same option name (``--out``, ``--repeat``) with their
own defaults; an option given on the command line goes to every selected suite that has it,
and one that no selected suite accepts is an error. ``--quick`` is passed to every suite.
``python -m benchmarks.<name> --help`` lists one suite's options.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable

from . import broker, client_decode, cluster, peers, scale, spark_io

#: name -> (add_arguments, run); each run prints its table and writes results/<name>.json.
SUITES: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "broker": (broker.add_arguments, broker.run),
    "client_decode": (client_decode.add_arguments, client_decode.run),
    "cluster": (cluster.add_arguments, cluster.run),
    "spark_io": (spark_io.add_arguments, spark_io.run),
    "scale": (scale.add_arguments, scale.run),
    "peers": (peers.add_arguments, peers.run),
}


#: in the --quick smoke run this suite runs in a child process beside the others
BESIDE = "spark_io"


def _suite_parser(name: str) -> argparse.ArgumentParser:
    sp = argparse.ArgumentParser(prog=f"python -m benchmarks --only {name}", usage=argparse.SUPPRESS,
                                 add_help=False, allow_abbrev=False)
    SUITES[name][0](sp)
    return sp


def _option_strings(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


def main(argv: list[str] | None = None) -> int:
    epilog = "\n\n".join(_suite_parser(name).format_help().strip().replace("options:", f"options of {name}:", 1)
                         for name in SUITES)
    p = argparse.ArgumentParser(prog="python -m benchmarks", description="rocketmq-spark benchmarks",
                                epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=sorted(SUITES), action="append",
                   help="run only this benchmark (repeatable; default: all)")
    p.add_argument("--quick", action="store_true", help="every suite in its small mode")
    args, rest = p.parse_known_args(argv)
    names = list(dict.fromkeys(args.only or SUITES))
    parsers = {name: _suite_parser(name) for name in names}
    accepted = set().union(*(_option_strings(sp) for sp in parsers.values()))
    for tok in rest:
        if tok.startswith("-") and tok.split("=", 1)[0] not in accepted:
            p.error(f"unrecognized argument {tok} (not an option of {', '.join(names)})")
    suite_args = {}
    for name, sp in parsers.items():
        own = rest + (["--quick"] if args.quick and "--quick" in _option_strings(sp) else [])
        suite_args[name], _ = sp.parse_known_args(own)
    rc = 0
    failed: list[str] = []
    t0 = time.perf_counter()
    beside = None
    if args.quick and len(names) > 1 and BESIDE in names:
        # the smoke run: the Spark suite (mostly JVM and worker start-up) runs in a child process
        # beside the others, so the whole run stays under a minute
        names.remove(BESIDE)
        own = [*rest, "--quick"]
        beside = subprocess.Popen([sys.executable, "-m", f"benchmarks.{BESIDE}", *own],
                                  cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for name in names:
        print(f"== {name} ==", flush=True)
        try:
            code = SUITES[name][1](suite_args[name])
        except Exception:  # noqa: BLE001 (one suite's failure must not hide the others' results)
            traceback.print_exc()
            code = 1
        if code:
            failed.append(name)
        rc = max(rc, code)
    if beside is not None:
        out, _ = beside.communicate()
        print(f"== {BESIDE} (ran beside the others) ==")
        print(out, end="", flush=True)
        if beside.returncode:
            failed.append(BESIDE)
            rc = max(rc, 1)
        names.append(BESIDE)
    print(f"benchmarks: {len(names) - len(failed)} of {len(names)} suites done in {time.perf_counter() - t0:.1f}s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main())
