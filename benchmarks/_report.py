"""Where a suite's results go, and the printed tables.

Every suite writes ``<results-dir>/<name>.json`` (``<name>-quick.json`` for ``--quick``, so a
smoke run never overwrites the full figures) and, beside it, the same name with ``.png`` (drawn
by :mod:`benchmarks._plot`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from ._plot import Panel, plot

__all__ = ["MB", "RESULTS_DIR", "add_results_dir", "per_s", "results_path", "table", "write_results"]

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
#: the benchmarks' megabyte
MB = 1_000_000


def per_s(amount: float, seconds: float) -> float:
    """``amount`` per second over ``seconds`` (0 when no time was measured)."""
    return amount / seconds if seconds > 0 else 0.0


def add_results_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results-dir", default=RESULTS_DIR,
                   help="directory for the JSON results and PNG plots (default benchmarks/results)")


def results_path(args: argparse.Namespace, name: str) -> str:
    """``<results-dir>/<name>[-quick].json``."""
    d = getattr(args, "results_dir", None) or RESULTS_DIR
    return os.path.join(d, f"{name}-quick.json" if getattr(args, "quick", False) else f"{name}.json")


def write_results(path: str, doc: dict[str, Any], panels: Sequence[Panel] | Callable[[str], None]) -> tuple[str, str]:
    """Write ``doc`` as JSON at ``path`` and the panels as a PNG beside it (or, when ``panels`` is
    a function, let it draw the PNG at the path it is given); returns both paths."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    png = os.path.splitext(path)[0] + ".png"
    if callable(panels):
        panels(png)
    else:
        plot(png, str(doc.get("benchmark", os.path.basename(path))), panels)
    print(f"results written to {os.path.relpath(path)} and {os.path.relpath(png)}")
    return path, png


def table(head: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    """The lines of a text table: each column as wide as its widest cell, the first ``left``
    columns left-aligned and the others right-aligned, two spaces between, a rule of dashes
    under the head, trailing spaces stripped."""
    widths = [max([len(head[i]), *(len(r[i]) for r in rows)]) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
