"""``python -m benchmarks [--quick] [--only NAME] [suite options]``: run the benchmark suites.

Every suite has its own options (its ``add_arguments``): each one parses the command line with
its own parser, so two suites may use the same option name (``--out``, ``--repeat``) with their
own defaults; an option given on the command line goes to every selected suite that has it,
and one that no selected suite accepts is an error. ``--quick`` is passed to every suite.
``python -m benchmarks.<name> --help`` lists one suite's options.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from . import broker, client_decode, cluster, spark_io

#: name -> (add_arguments, run); each run prints its table and writes results/<name>.json.
SUITES: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "broker": (broker.add_arguments, broker.run),
    "client_decode": (client_decode.add_arguments, client_decode.run),
    "cluster": (cluster.add_arguments, cluster.run),
    "spark_io": (spark_io.add_arguments, spark_io.run),
}


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
    for name in names:
        rc = max(rc, SUITES[name][1](suite_args[name]))
    return rc


if __name__ == "__main__":
    sys.exit(main())
