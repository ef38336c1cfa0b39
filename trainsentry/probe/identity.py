"""Who this rank is and how its probe is configured, read from the environment (pure)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_PORT = 9401
DEFAULT_INTERVAL_S = 2.0
DEFAULT_RAS_INTERVAL_S = 30.0
DEFAULT_FR_BUFFER = "2000"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, "") or default)
    except ValueError:
        return default


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        value = float(env.get(name, "") or default)
    except ValueError:
        return default
    return value if value > 0 else default


@dataclass(frozen=True)
class ProbeConfig:
    """Identity (torchrun-style RANK/LOCAL_RANK/WORLD_SIZE, node, job) and probe settings."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    node: str = ""
    pod: str = ""
    trainingjob: str = ""
    namespace: str = ""
    bind: str = "0.0.0.0"
    port: int = DEFAULT_PORT  # this rank's port (base + LOCAL_RANK unless the base is 0)
    interval_s: float = DEFAULT_INTERVAL_S
    # Full Flight Recorder dump on every poll (for collective durations). The dump holds
    # the GIL for tens of ms with a full buffer, so it is off by default.
    full_dumps: bool = False
    ras: str = "auto"  # "auto" (rank 0 with NCCL), "1" (rank 0 always), "0" (never)
    ras_addr: str = "127.0.0.1:28028"
    ras_interval_s: float = DEFAULT_RAS_INTERVAL_S
    token: str | None = field(default=None, repr=False)  # secret: from the environment only

    @property
    def labels(self) -> dict[str, str]:
        """Labels every probe series carries."""
        return {
            "namespace": self.namespace,
            "trainingjob": self.trainingjob,
            "node": self.node,
            "rank": str(self.rank),
            "local_rank": str(self.local_rank),
        }

    def ras_enabled(self, nccl_in_use: bool) -> bool:
        if self.rank != 0 or self.ras == "0":
            return False
        return self.ras == "1" or nccl_in_use


def config_from_env(env: Mapping[str, str] | None = None) -> ProbeConfig:
    """ProbeConfig from TRAINSENTRY_PROBE_* and the launcher's variables."""
    env = os.environ if env is None else env
    local_rank = _int(env, "LOCAL_RANK", 0)
    base_port = _int(env, "TRAINSENTRY_PROBE_PORT", DEFAULT_PORT)
    ras = (env.get("TRAINSENTRY_PROBE_RAS", "auto") or "auto").strip().lower()
    return ProbeConfig(
        rank=_int(env, "RANK", 0),
        local_rank=local_rank,
        world_size=_int(env, "WORLD_SIZE", 1),
        node=env.get("TRAINSENTRY_NODE") or env.get("NODE_NAME") or socket.gethostname(),
        pod=env.get("POD_NAME") or env.get("HOSTNAME", ""),
        trainingjob=env.get("TRAINSENTRY_JOB", ""),
        namespace=env.get("TRAINSENTRY_NAMESPACE") or env.get("POD_NAMESPACE", ""),
        bind=env.get("TRAINSENTRY_PROBE_BIND", "0.0.0.0") or "0.0.0.0",
        port=base_port + local_rank if base_port > 0 else 0,
        interval_s=_float(env, "TRAINSENTRY_PROBE_INTERVAL", DEFAULT_INTERVAL_S),
        full_dumps=env.get("TRAINSENTRY_PROBE_FULL_DUMPS", "").strip().lower()
        in {"1", "true", "yes", "on"},
        ras=ras if ras in {"auto", "0", "1"} else "auto",
        ras_addr=env.get("NCCL_RAS_ADDR", "127.0.0.1:28028") or "127.0.0.1:28028",
        ras_interval_s=_float(env, "TRAINSENTRY_PROBE_RAS_INTERVAL", DEFAULT_RAS_INTERVAL_S),
        token=env.get("TRAINSENTRY_PROBE_TOKEN") or None,
    )
