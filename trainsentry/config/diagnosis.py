"""The `diagnosis:` section: diagnosed hang alerts (gateway/stages/hang/diagnosis.py holds a hang
page until the ranks' dumps say which rank never arrived)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainsentry.alerts import PROBE_HANG_ALERT

# The Prometheus rules' hang alerts and the probe's own (gateway/stages/hang/trigger.py).
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
    # The /status asked at once when locating a hang's suspects (a few KB each, where a
    # dump is MBs: the 127 quiet members of a 16,384-rank job's stalled group in one round,
    # not four rounds of 32 that outlast the search's share of the deadline).
    status_concurrency: int = Field(default=256, ge=1, le=4096)
    probe_token_env: str = "TRAINSENTRY_PROBE_TOKEN"
    # "namespace/name" (or "name") -> probe addresses "ip:port", for clusters without API access
    # and for the demo; otherwise the Kubernetes API is asked (needs RBAC: get trainingjobs,
    # list pods).
    static_endpoints: dict[str, list[str]] = Field(default_factory=dict)
    kubernetes: bool = False
    # A checkpoint (every culprit saving one while its peers wait) is paged only once the
    # peers have waited this long; a TrainingJob's spec.checkpointLimitSeconds overrides it.
    checkpoint_limit_seconds: float = Field(default=1800.0, ge=5, le=7 * 86400)
    # Bounds per job hang (gateway/stages/hang/locate.py, hang/enrichment.py): the stalled
    # group is located from the triggers and the ranks' /status first; then at most
    # `max_dumps` dumps (the suspects first), each cut at `max_dump_bytes` while it is read,
    # at most `dump_budget_bytes` per diagnosis and `total_dump_budget_bytes` over all
    # diagnoses at once; at most `max_status` /status asked per diagnosis.
    max_dumps: int = Field(default=32, ge=1, le=4096)
    max_status: int = Field(default=512, ge=1, le=65536)
    max_dump_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=1024**3)
    dump_budget_bytes: int = Field(default=96 * 1024 * 1024, ge=1024, le=8 * 1024**3)
    total_dump_budget_bytes: int = Field(default=192 * 1024 * 1024, ge=1024, le=16 * 1024**3)
    # How long after a job's first trigger the diagnosis waits for the other ranks' triggers
    # (each probe posts within its poll interval and its jitter: 1 s, 1 s per 1,000 ranks
    # above that) before locating.
    settle_seconds: float = Field(default=3.0, ge=0, le=30)
    # Store writes (a new hang, its end) per job and minute; more get 429.
    trigger_writes_per_minute: float = Field(default=30.0, gt=0, le=6000)

    @model_validator(mode="after")
    def _deadline_within_the_hold(self) -> DiagnosisSettings:
        """The diagnosis must end before the held page goes out, or a checkpoint is paged
        as a hang's page with the verdict arriving after it. Left unset, the deadline is
        4 s or two thirds of the hold, whichever is shorter; set, it must be below it."""
        if "deadline_seconds" not in self.model_fields_set:
            self.deadline_seconds = min(self.deadline_seconds, self.hold_seconds * 2 / 3)
        if self.deadline_seconds >= self.hold_seconds:
            raise ValueError(
                f"deadline_seconds ({self.deadline_seconds:g}) must be below hold_seconds "
                f"({self.hold_seconds:g}): the diagnosis must end before the page is released"
            )
        return self
