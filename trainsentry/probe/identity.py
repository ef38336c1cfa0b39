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
DEFAULT_DUMP_DIR = "/var/run/trainsentry/fr"
DUMP_PREFIX = "fr_rank_"
TORCH_DEFAULT_DUMP_PREFIX = "/tmp/nccl_trace_rank_"
_OFF = {"0", "false", "no", "off"}


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
    #: Where torch's watchdog writes its dumps on a timeout: `<prefix><rank>`
    #: (TORCH_FR_DUMP_TEMP_FILE; torch's own default when unset).
    dump_prefix: str = TORCH_DEFAULT_DUMP_PREFIX
    #: This pod's addresses (POD_IP from the downward API, else the host name's addresses):
    #: NCCL RAS names a process by address and pid.
    host_ips: tuple[str, ...] = ()
    #: The gateway's base URL (TRAINSENTRY_GATEWAY_URL): a stall is posted there at once
    #: (`trigger.py`); "" = only the Prometheus rules find hangs.
    gateway_url: str = ""
    #: The stall detector's floor, factor and no-history threshold (`stall.StallPolicy`).
    stall_floor_s: float = 20.0
    stall_factor: float = 10.0
    stall_startup_s: float = 300.0

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


def torch_settings(env: Mapping[str, str], dump_dir: str) -> dict[str, str]:
    """Pure: the torch variables a hang diagnosis needs that the user has not set.

    - TORCH_FR_BUFFER_SIZE=2000: the Flight Recorder (off without it; read when a process
      group is created, so this must happen before `init_process_group`).
    - TORCH_NCCL_ENABLE_TIMING=1: NCCL records when a collective *started* on the GPU, which
      tells a rank whose GPU never reached a collective from its peers (docs/probe.md has
      its cost).
    - TORCH_NCCL_DUMP_ON_TIMEOUT=1 and TORCH_FR_DUMP_TEMP_FILE=<dump_dir>/fr_rank_: the
      watchdog writes every rank's dump when a collective times out, so a job that dies on
      the timeout can still be diagnosed (`/dumps`, `trainsentry analyze`).

    A variable the user set (to any value) is left alone, as are the older names torch
    still reads (TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE);
    TRAINSENTRY_PROBE_TORCH_ENV=0 sets nothing at all.
    """
    if env.get("TRAINSENTRY_PROBE_TORCH_ENV", "").strip().lower() in _OFF:
        return {}
    wanted = {
        ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"): DEFAULT_FR_BUFFER,
        ("TORCH_NCCL_ENABLE_TIMING",): "1",
        ("TORCH_NCCL_DUMP_ON_TIMEOUT",): "1",
        ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"): (
            f"{dump_dir.rstrip('/')}/{DUMP_PREFIX}"
        ),
    }
    return {names[0]: value for names, value in wanted.items() if not any(n in env for n in names)}


def host_ips(env: Mapping[str, str]) -> tuple[str, ...]:
    """This pod's IP addresses: POD_IP (and POD_IPS) if set, else what the host name resolves to."""
    given = [ip.strip() for key in ("POD_IP", "POD_IPS") for ip in env.get(key, "").split(",")]
    found = [ip for ip in given if ip]
    if not found:
        try:
            found = socket.gethostbyname_ex(socket.gethostname())[2]
        except OSError:
            found = []
    return tuple(dict.fromkeys(found))


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
        # stripped: a Secret made from an echoed file ends in a newline (the gateway strips
        # its copy of this token too)
        token=(env.get("TRAINSENTRY_PROBE_TOKEN") or "").strip() or None,
        dump_prefix=env.get("TORCH_FR_DUMP_TEMP_FILE")
        or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
        or TORCH_DEFAULT_DUMP_PREFIX,
        host_ips=host_ips(env),
        gateway_url=(env.get("TRAINSENTRY_GATEWAY_URL", "") or "").strip(),
        stall_floor_s=_float(env, "TRAINSENTRY_PROBE_STALL_FLOOR", 20.0),
        stall_factor=_float(env, "TRAINSENTRY_PROBE_STALL_FACTOR", 10.0),
        stall_startup_s=_float(env, "TRAINSENTRY_PROBE_STALL_STARTUP", 300.0),
    )
