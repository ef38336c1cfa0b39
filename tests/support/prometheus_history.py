"""A real Prometheus that remembers alerts having fired, for the tests of what the gateway
asks it (gateway/stages/services/evidence.py).

Prometheus's documentation ("Alerting rules", *Inspecting alerts during runtime*): "For
pending and firing alerts, Prometheus also stores synthetic time series of the form
`ALERTS{alertname="<alert name>", alertstate="<pending or firing>", <additional alert
labels>}`. The sample value is set to 1 as long as the alert is in the indicated active
(pending or firing) state, and the series is marked stale when this is no longer the case."
Its rule manager writes a sample at every evaluation, the first at the evaluation the alert
fires at, which is the `startsAt` it sends (`FiredAt`). `history` writes that series for
each alert as Alertmanager delivered it (webhook_factory's shape): one sample every
`every_s` from its `startsAt` for `lasting_s`; `remembering` starts a Prometheus with it
backfilled (`promtool tsdb create-blocks-from openmetrics`).
`tests/gateway/stages/test_cordon_guards.py` also runs the shipped rules in a real
Prometheus, against which these written series are the same shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.support.realservers import RunningServer, start_prometheus


def _value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def history(
    alerts: Iterable[Mapping[str, Any]],
    *,
    every_s: float = 30.0,
    lasting_s: float = 300.0,
    without: Iterable[str] = (),
) -> str:
    """OpenMetrics text of the `ALERTS` series of these alerts firing; `without`: labels the
    alerts carry that the series does not (Prometheus's external labels)."""
    left_out = set(without)
    series: dict[str, list[float]] = {}
    for alert in alerts:
        labels = {k: v for k, v in alert["labels"].items() if k not in left_out}
        labels["alertstate"] = "firing"
        name = ",".join(f'{k}="{_value(v)}"' for k, v in sorted(labels.items()))
        start = datetime.fromisoformat(alert["startsAt"].replace("Z", "+00:00")).timestamp()
        steps = int(lasting_s // every_s) + 1
        series.setdefault(name, []).extend(start + i * every_s for i in range(steps))
    lines = ["# TYPE ALERTS gauge"]
    for name, times in sorted(series.items()):
        lines += [f"ALERTS{{{name}}} 1 {at:.3f}" for at in sorted(set(times))]
    return "\n".join([*lines, "# EOF", ""])


def remembering(
    tmp_path: Path, alerts: Iterable[Mapping[str, Any]], **kwargs: Any
) -> RunningServer:
    """A Prometheus whose storage holds these alerts' `ALERTS` series (stop it after use)."""
    return start_prometheus(tmp_path, {"global": {}}, backfill=history(alerts, **kwargs))
