"""The gateway's parts that are off, as explicit absent values: `assemble.py` builds the
`Gateway` whole, and a feature the settings leave out is one of these, never `None`.

Invariants: an off part's lifecycle (`start`, `stop`, `run_once`) and the calls that feed it
(`feed`, `diagnose`, ...) do nothing, so the stages and `Gateway.settle` call every part
alike; code that answers differently when a feature is off (an HTTP error with the reason, a
page without the feature's buttons) asks `isinstance(part, Off)` where it answers, and says
the reason there, as the feature's docs do.
"""

from __future__ import annotations


class Off:
    """A part of the gateway that is off: started, stopped and run, it does nothing."""

    def start(self, *_args: object) -> None:
        """Nothing to start."""

    async def stop(self) -> None:
        """Nothing to stop."""

    async def run_once(self) -> None:
        """Nothing due."""


class TickerOff(Off):
    """No policy timers: a test's plan runs in place of the real policy (assemble.py)."""


class HandoffsOff(Off):
    """No handoff notices: the settings have no `oncall:` section."""


class OncallOff(Off):
    """No on-call schedules: the settings have no `oncall:` section (the API answers 404)."""


class MaintenanceOff(Off):
    """No maintenance windows: they belong to the real policy, which a test's plan replaces."""


class CordonOff(Off):
    """No cordon recommendations: `remediation.cordon` is off (or no real policy runs)."""


class EscalationOff(Off):
    """No phone escalation: no roster says who is on call."""


class HangsOff(Off):
    """No hang diagnosis: hang alerts are not held, the probes' triggers are refused (404)."""

    def diagnose(self, *_changes: object) -> None:
        """Nothing is diagnosed."""


class TopologyOff(Off):
    """No topology: no node has a place (`topology:` is not configured)."""

    def current(self) -> None:
        """No topology now, nor ever."""
        return None


class JobStatusOff(Off):
    """TrainingJobs' status is not written (`gateway.trainingjob_status` is off)."""

    def feed(self, *_args: object) -> None:
        """Nothing is written."""

    def feed_verdict(self, *_args: object) -> None:
        """Nothing is written."""


class JobAlertingOff(Off):
    """TrainingJobs' own routes are not read (no `job_alerting`, or no cluster to read)."""
