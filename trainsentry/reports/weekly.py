"""The weekly report as an email: HTML + text (jinja2), PNG charts by Content-ID, a CSV of
the period's occurrences, and the MIME message. Pure: `WeeklyStats` in, bytes and strings out.

MIME layout (what mail clients expect for inline images plus an attachment):

    multipart/mixed
      multipart/alternative
        text/plain
        multipart/related
          text/html            <img src="cid:...">
          image/png  x3        Content-ID, Content-Disposition: inline
      text/csv                 attachment

The preview (`render --out`) is the same HTML with every `cid:` replaced by a data: URI.
"""

from __future__ import annotations

import base64
import csv
import io
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from email.message import EmailMessage, MIMEPart
from functools import cache
from typing import Any

import yaml
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from trainsentry.assets import rules_dir
from trainsentry.labels import GPU_ID_LABELS, first_label
from trainsentry.notifiers.email import Attachment, build_message
from trainsentry.reports import charts
from trainsentry.reports.figures import Change, WeeklyStats
from trainsentry.reports.stats import PRIORITIES

CHART_NAMES = ("per_day", "mttr", "nodes")
CSV_COLUMNS = (
    "id",
    "fingerprint",
    "alertname",
    "priority",
    "component",
    "class",
    "namespace",
    "job",
    "node",
    "gpu",
    "xid",
    "starts_at",
    "created_at",
    "acked_at",
    "acked_by",
    "resolved_at",
    "seconds_to_ack",
    "seconds_to_resolve",
    "summary",
)


@dataclass(frozen=True, slots=True)
class Chart:
    name: str
    cid: str  # without angle brackets
    png: bytes


@dataclass(frozen=True, slots=True)
class RenderedReport:
    subject: str
    html: str  # images referenced as cid:
    preview_html: str  # images embedded as data: URIs
    text: str
    csv: bytes
    csv_filename: str
    charts: tuple[Chart, ...]
    headline: tuple[tuple[str, str, str], ...] = field(default=())


@dataclass(frozen=True, slots=True)
class RenderOptions:
    subject_prefix: str = "[trainsentry]"
    cluster_name: str = ""
    link: str = ""
    cid_domain: str = "trainsentry.report"


# ---------------------------------------------------------------- formatting


def duration(seconds: float | None) -> str:
    """Short human duration: 45 s, 12 min, 3 h 05 min, 2 d 4 h; "—" when unknown."""
    if seconds is None:
        return "—"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def number(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if float(value).is_integer() or abs(value) >= 100 else f"{value:,.1f}"


def value_text(value: float | None, unit: str = "count") -> str:
    return duration(value) if unit == "seconds" else number(value)


def change_text(change: Change) -> str:
    if change.delta is None:
        return "—"
    if change.delta == 0:
        return "same"
    sign = "+" if change.delta > 0 else "−"
    text = f"{sign}{value_text(abs(change.delta), change.unit)}"
    if change.percent is not None:
        text += f" ({sign}{abs(change.percent):.0f}%)"
    return text


@cache
def xid_names() -> dict[str, str]:
    """XID code → meaning, from the shipped catalogue (rules/xid_catalogue.yaml)."""
    path = rules_dir() / "xid_catalogue.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError:
        return {}
    return {
        str(code): str(entry.get("name", "")) for code, entry in (data.get("xid") or {}).items()
    }


@cache
def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("trainsentry.reports", "templates"),
        autoescape=select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
        undefined=StrictUndefined,
        trim_blocks=False,
        keep_trailing_newline=True,
    )
    env.filters["dur"] = duration
    env.filters["num"] = number
    env.filters["change"] = change_text
    env.filters["value"] = value_text
    return env


def headline(stats: WeeklyStats) -> tuple[tuple[str, str, str], ...]:
    """The boxes at the top: (label, value, note)."""
    prev = stats.previous

    def vs(current: float, previous: float | None) -> str:
        if previous is None:
            return ""
        delta = current - previous
        return (
            "same as last period"
            if delta == 0
            else f"{'+' if delta > 0 else '−'}{number(abs(delta))} vs last period"
        )

    p0_p1 = stats.by_priority["P0"] + stats.by_priority["P1"]
    return (
        ("Alerts", str(stats.total), vs(stats.total, prev.total if prev else None)),
        (
            "P0 + P1",
            str(p0_p1),
            vs(
                p0_p1,
                prev.by_priority.get("P0", 0) + prev.by_priority.get("P1", 0) if prev else None,
            ),
        ),
        (
            "MTTA (median)",
            duration(stats.mtta["all"].median_s),
            f"p90 {duration(stats.mtta['all'].p90_s)}",
        ),
        (
            "MTTR (median)",
            duration(stats.mttr["all"].median_s),
            f"p90 {duration(stats.mttr['all'].p90_s)}",
        ),
        (
            "Pages acked",
            f"{stats.pages.acked}/{stats.pages.incidents}",
            f"{stats.pages.calls} calls",
        ),
        ("Hardware faults", str(stats.hardware), f"{len(stats.hot_nodes)} nodes"),
    )


def subject(stats: WeeklyStats, options: RenderOptions) -> str:
    where = f" {options.cluster_name}" if options.cluster_name else ""
    team = f" ({stats.scope.name})" if stats.scope.name != "cluster" else ""
    p0 = stats.by_priority["P0"]
    return (
        f"{options.subject_prefix} Weekly report{where}{team} {stats.period.first_day:%d %b}–"
        f"{stats.period.last_day:%d %b %Y}: {stats.total} alerts, {p0} P0"
    ).strip()


# ---------------------------------------------------------------- parts


def occurrences_csv(stats: WeeklyStats) -> bytes:
    """One row per alert occurrence of the period (UTF-8 with BOM so spreadsheets get it)."""
    end = stats.period.end
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)

    def iso(moment: datetime | None) -> str:
        return "" if moment is None or moment >= end else moment.isoformat()

    def seconds(later: datetime | None, earlier: datetime) -> str:
        return "" if later is None or later >= end else f"{(later - earlier).total_seconds():.0f}"

    for occ in stats.occurrences:
        writer.writerow(
            (
                occ.id,
                occ.fingerprint,
                occ.alertname,
                occ.priority,
                occ.component,
                stats.classes.get(occ.id, ""),
                occ.namespace,
                occ.job,
                occ.node,
                first_label(occ.labels, GPU_ID_LABELS),
                occ.labels.get("xid", ""),
                occ.starts_at.isoformat(),
                occ.created_at.isoformat(),
                iso(occ.acked_at),
                occ.acked_by or "" if iso(occ.acked_at) else "",
                iso(occ.resolved_at),
                seconds(occ.acked_at, occ.created_at),
                seconds(occ.resolved_at, occ.starts_at),
                occ.summary,
            )
        )
    return ("\ufeff" + out.getvalue()).encode("utf-8")


def make_charts(stats: WeeklyStats, cid_domain: str = "trainsentry.report") -> tuple[Chart, ...]:
    previous_mttr = stats.previous.mttr_median_s if stats.previous else None
    images = {
        "per_day": charts.alerts_per_day(stats.per_day),
        "mttr": charts.mttr_trend(stats.mttr_per_day, previous_mttr),
        "nodes": charts.top_nodes(stats.hot_nodes),
    }
    return tuple(
        # Short ids: a folded Content-ID header trips up some mail clients.
        Chart(name, f"{name}.{secrets.token_hex(6)}@{cid_domain}", png)
        for name, png in images.items()
    )


def _render(template: str, stats: WeeklyStats, context: Mapping[str, Any]) -> str:
    return (
        _env()
        .get_template(template)
        .render(s=stats, priorities=PRIORITIES, xid_names=xid_names(), **context)
    )


def _local(stats: WeeklyStats) -> Any:
    def local(moment: datetime | None) -> str:
        if moment is None:
            return "—"
        return moment.astimezone(stats.period.zone).strftime("%a %d %b %H:%M")

    return local


def render(stats: WeeklyStats, options: RenderOptions = RenderOptions()) -> RenderedReport:
    """Everything the email (and the preview) needs, from the statistics."""
    the_subject = subject(stats, options)
    boxes = headline(stats)
    chart_list = make_charts(stats, options.cid_domain)
    context = {
        "subject": the_subject,
        "headline": boxes,
        "cluster": options.cluster_name,
        "link": options.link,
        "local": _local(stats),
    }
    cid_src = {c.name: f"cid:{c.cid}" for c in chart_list}
    data_src = {
        c.name: "data:image/png;base64," + base64.b64encode(c.png).decode("ascii")
        for c in chart_list
    }
    first = stats.period.first_day.isoformat()
    scope = "" if stats.scope.name == "cluster" else f"-{stats.scope.name}"
    return RenderedReport(
        subject=the_subject,
        html=_render("weekly.html.j2", stats, {**context, "img": cid_src}),
        preview_html=_render("weekly.html.j2", stats, {**context, "img": data_src}),
        text=_render("weekly.txt.j2", stats, context),
        csv=occurrences_csv(stats),
        csv_filename=f"trainsentry-alerts{scope}-{first}.csv",
        charts=chart_list,
        headline=boxes,
    )


def to_message(report: RenderedReport, sender: str, recipients: Sequence[str]) -> EmailMessage:
    """The MIME message (see the module docstring for its layout)."""
    message = build_message(
        sender,
        recipients,
        report.subject,
        report.text,
        report.html,
        attachments=[Attachment(report.csv_filename, report.csv, "text/csv")],
    )
    html_part = next(part for part in message.walk() if part.get_content_type() == "text/html")
    assert isinstance(html_part, MIMEPart)
    for chart in report.charts:
        html_part.add_related(
            chart.png,
            maintype="image",
            subtype="png",
            cid=f"<{chart.cid}>",
            disposition="inline",
            filename=f"{chart.name}.png",
        )
    return message
