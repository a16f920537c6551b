"""A suite's PNG plot: horizontal bar charts of its headline figures, one panel per question,
baselines drawn grey next to the scenarios measured against them, targets as dashed lines.

:func:`benchmarks._report.write_results` draws it beside the suite's JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Bar", "Panel", "plot"]


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
