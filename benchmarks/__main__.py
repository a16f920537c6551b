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
    latency         latency        send -> sink latency at steady rates: our reader (embedded broker,
                                   Apache RocketMQ), Spark's Kafka source, a trivial Python source

``--quick`` is a smoke run (CI runs it from tests/test_benchmarks_smoke.py and checks that every
result and plot is written, never how fast); to stay under a minute it runs spark_io and latency
(the Spark suites) in child processes beside the other suites, so their figures are not for
comparison.

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

from . import broker, client_decode, cluster, latency, peers, scale, spark_io

#: name -> (add_arguments, run); each run prints its table and writes results/<name>.json.
SUITES: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "broker": (broker.add_arguments, broker.run),
    "client_decode": (client_decode.add_arguments, client_decode.run),
    "cluster": (cluster.add_arguments, cluster.run),
    "spark_io": (spark_io.add_arguments, spark_io.run),
    "scale": (scale.add_arguments, scale.run),
    "peers": (peers.add_arguments, peers.run),
    "latency": (latency.add_arguments, latency.run),
}


#: in the --quick smoke run these suites run in child processes beside the others (each in its own)
BESIDE = ("spark_io", "latency")


def _suite_parser(name: str) -> argparse.ArgumentParser:
    sp = argparse.ArgumentParser(prog=f"python -m benchmarks --only {name}", usage=argparse.SUPPRESS,
                                 add_help=False, allow_abbrev=False)
    SUITES[name][0](sp)
    return sp


def _option_strings(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


def _own_tokens(p: argparse.ArgumentParser, rest: list[str]) -> list[str]:
    """The options of ``rest`` that ``p`` accepts, each with its value (for a suite run in a
    child process, whose parser refuses the other suites' options)."""
    out: list[str] = []
    i = 0
    while i < len(rest):
        tok = rest[i]
        i += 1
        if not tok.startswith("-"):
            continue
        action = p._option_string_actions.get(tok.split("=", 1)[0])
        takes = 0 if "=" in tok or action is None or action.nargs == 0 else 1
        if action is not None:
            out += [tok, *rest[i:i + takes]]
        i += takes
    return out


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
    beside: dict[str, subprocess.Popen[str]] = {}
    if args.quick and len(names) > 1:
        # the smoke run: the Spark suites (mostly JVM and worker start-up) run in child processes
        # beside the others, so the whole run stays under a minute
        for name in [n for n in BESIDE if n in names]:
            names.remove(name)
            own = [*_own_tokens(parsers[name], rest), "--quick"]
            beside[name] = subprocess.Popen([sys.executable, "-m", f"benchmarks.{name}", *own],
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
    for name, child in beside.items():
        out, _ = child.communicate()
        print(f"== {name} (ran beside the others) ==")
        print(out, end="", flush=True)
        if child.returncode:
            failed.append(name)
            rc = max(rc, 1)
        names.append(name)
    print(f"benchmarks: {len(names) - len(failed)} of {len(names)} suites done in {time.perf_counter() - t0:.1f}s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main())
