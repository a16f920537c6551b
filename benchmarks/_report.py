"""Where a suite's results go, and its PNG plot.

Every suite writes ``<results-dir>/<name>.json`` (``<name>-quick.json`` for ``--quick``, so a
smoke run never overwrites the full figures) and, beside it, the same name with ``.png``: a
horizontal bar chart of the suite's headline figures, baselines drawn grey next to the
scenarios measured against them, and the targets as dashed lines.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def add_results_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results-dir", default=RESULTS_DIR,
                   help="directory for the JSON results and PNG plots (default benchmarks/results)")


def results_path(args: argparse.Namespace, name: str) -> str:
    """``<results-dir>/<name>[-quick].json``."""
    d = getattr(args, "results_dir", None) or RESULTS_DIR
    return os.path.join(d, f"{name}-quick.json" if getattr(args, "quick", False) else f"{name}.json")


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    baseline: bool = False  # a reference the others are compared with (drawn grey)


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    bars: Sequence[Bar]
    target: float | None = None
    log: bool = False


def write_results(path: str, doc: dict[str, Any], panels: Sequence[Panel]) -> tuple[str, str]:
    """Write ``doc`` as JSON at ``path`` and the panels as a PNG beside it; returns both paths."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    png = os.path.splitext(path)[0] + ".png"
    plot(png, str(doc.get("benchmark", os.path.basename(path))), panels)
    print(f"results written to {os.path.relpath(path)} and {os.path.relpath(png)}")
    return path, png


def plot(png: str, title: str, panels: Sequence[Panel]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in panels if p.bars] or [Panel("no results", "", [Bar("(none)", 0.0)])]
    heights = [max(1.6, 0.42 * len(p.bars) + 1.1) for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, p in zip(axes[:, 0], panels):
        labels = [b.label for b in p.bars]
        values = [b.value for b in p.bars]
        colors = ["#9e9e9e" if b.baseline else "#1f77b4" for b in p.bars]
        ys = range(len(p.bars))
        ax.barh(list(ys), values, color=colors)
        ax.set_yticks(list(ys), labels, fontsize=8)
        ax.invert_yaxis()
        if p.log and all(v > 0 for v in values):
            ax.set_xscale("log")
        top = max(values + ([p.target] if p.target else []) + [1e-9])
        for y, v in zip(ys, values):
            ax.text(v, y, f" {_fmt(v)}", va="center", fontsize=7)
        if p.target:
            ax.axvline(p.target, color="#d62728", linestyle="--", linewidth=1)
            ax.text(p.target, -0.6, f" target {_fmt(p.target)}", color="#d62728", fontsize=7, va="bottom")
        if not p.log:
            ax.set_xlim(0, top * 1.22)
        ax.set_title(p.title, fontsize=9, loc="left")
        ax.set_xlabel(p.unit, fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _fmt(v: float) -> str:
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:,.2f}"
    return f"{v:.3g}"
