"""The `diagnosis:` section: diagnosed hang alerts (gateway/stages/diagnosis.py holds a hang
page until the ranks' dumps say which rank never arrived)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from trainsentry.alerts import PROBE_HANG_ALERT

# The Prometheus rules' hang alerts and the probe's own (gateway/stages/hang_trigger.py).
DEFAULT_HANG_ALERTS = ("TrainingJobHang", "TrainingRankStalledBehindPeers", PROBE_HANG_ALERT)


class DiagnosisSettings(BaseModel):
    """The `diagnosis:` section of the config file."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    alertnames: list[str] = Field(default_factory=lambda: list(DEFAULT_HANG_ALERTS))
    hold_seconds: float = Field(default=6.0, gt=0, le=60)
    deadline_seconds: float = Field(default=4.0, gt=0, le=60)
    request_timeout_seconds: float = Field(default=2.0, gt=0, le=60)
    concurrency: int = Field(default=32, ge=1, le=512)
    probe_token_env: str = "TRAINSENTRY_PROBE_TOKEN"
    # "namespace/name" (or "name") -> probe addresses "ip:port", for clusters without API access
    # and for the demo; otherwise the Kubernetes API is asked (needs RBAC: get trainingjobs,
    # list pods).
    static_endpoints: dict[str, list[str]] = Field(default_factory=dict)
    kubernetes: bool = False
    # A checkpoint (every culprit saving one while its peers wait) is paged only once the
    # peers have waited this long; a TrainingJob's spec.checkpointLimitSeconds overrides it.
    checkpoint_limit_seconds: float = Field(default=1800.0, ge=5, le=7 * 86400)
