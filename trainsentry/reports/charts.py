"""The report's charts as PNG bytes (matplotlib, Agg, no pyplot global state).

Each function takes plain numbers from `WeeklyStats` and returns a PNG. Colours follow the
priority colours of the cards and emails (P0 red .. P3 blue).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from datetime import date

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from trainsentry.reports.figures import Hotspot
from trainsentry.reports.stats import PRIORITIES

PRIORITY_COLOURS = {"P0": "#d83931", "P1": "#de7802", "P2": "#d4a106", "P3": "#245bdb"}
_SIZE = (6.3, 2.8)  # inches; at 100 dpi 630 px: the mail column (680 - border - padding), 1:1
_DPI = 100


def _figure(left: float = 0.08) -> Figure:
    # Fixed margins: a constrained layout costs twice the time for the same picture here.
    fig = Figure(figsize=_SIZE)
    fig.subplots_adjust(left=left, right=0.98, top=0.88, bottom=0.11)
    fig.add_subplot()
    return fig


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    # No timestamp/software metadata: the same numbers give the same bytes.
    fig.savefig(buffer, format="png", dpi=_DPI, metadata={"Software": None})
    return buffer.getvalue()


def _style(fig: Figure, title: str) -> None:
    ax = fig.axes[0]
    ax.set_title(title, loc="left", fontsize=11)
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.tick_params(labelsize=8)


def alerts_per_day(per_day: Sequence[tuple[date, Mapping[str, int]]]) -> bytes:
    """Stacked bars: alerts started per local day, by priority."""
    fig = _figure()
    ax = fig.axes[0]
    labels = [d.strftime("%a %d") for d, _ in per_day]
    bottom = [0] * len(per_day)
    for priority in PRIORITIES:
        values = [counts.get(priority, 0) for _, counts in per_day]
        ax.bar(labels, values, bottom=bottom, color=PRIORITY_COLOURS[priority], label=priority)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.legend(fontsize=8, ncols=4, frameon=False, loc="upper left", bbox_to_anchor=(0.0, 1.0))
    ax.set_ylim(0, max([*bottom, 1]) * 1.25)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _style(fig, "Alerts per day by priority")
    return _png(fig)


def mttr_trend(
    mttr_per_day: Sequence[tuple[date, float | None]], previous_median_s: float | None
) -> bytes:
    """Median time to resolve per day (minutes), with last period's median as a line."""
    fig = _figure()
    ax = fig.axes[0]
    labels = [d.strftime("%a %d") for d, _ in mttr_per_day]
    xs = list(range(len(labels)))
    known = [v for _, v in mttr_per_day if v is not None]
    if previous_median_s is not None:
        known.append(previous_median_s)
    # Minutes read better for short outages, hours for long ones.
    scale, unit = (3600.0, "hours") if known and max(known) > 3 * 3600 else (60.0, "minutes")
    points = [(x, v / scale) for x, (_, v) in zip(xs, mttr_per_day, strict=True) if v is not None]
    if points:
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o",
            color="#245bdb",
            label="median MTTR this period",
        )
    if previous_median_s is not None:
        ax.axhline(
            previous_median_s / scale, color="#8f959e", linestyle="--", label="median last period"
        )
    if not points and previous_median_s is None:
        ax.text(0.5, 0.5, "nothing resolved", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks(xs, labels)
    ax.set_xlim(-0.5, len(xs) - 0.5)  # room for the first and last day's labels
    ax.set_ylim(bottom=0)
    ax.set_ylabel(unit, fontsize=8)
    if points or previous_median_s is not None:
        ax.legend(fontsize=8, frameon=False)
    _style(fig, "Time to resolve (median per day)")
    return _png(fig)


def top_nodes(nodes: Sequence[Hotspot]) -> bytes:
    """Horizontal bars: the sickest nodes by their hardware fault score."""
    shown = list(nodes)[:10]
    longest = max((len(n.key) for n in shown), default=4)
    fig = _figure(left=min(0.5, 0.04 + 0.0095 * longest))
    ax = fig.axes[0]
    if shown:
        ax.barh(
            [n.key for n in reversed(shown)], [n.score for n in reversed(shown)], color="#d83931"
        )
    else:
        ax.text(0.5, 0.5, "no hardware faults", ha="center", va="center", transform=ax.transAxes)
        ax.set_yticks([])
    _style(fig, "Sickest nodes (hardware fault score)")
    return _png(fig)
