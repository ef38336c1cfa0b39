"""Training-side probe: collective progress from PyTorch's Flight Recorder, served per rank.

    import trainsentry.probe
    trainsentry.probe.start()      # before or after init_process_group; never raises
    for batch in data:
        ...
        trainsentry.probe.step()   # optional user step counter
    with trainsentry.probe.phase("checkpoint"):   # optional: a pause that is not a hang
        save(...)

Or without code changes: `TRAINSENTRY_PROBE=1 torchrun ... -m trainsentry.probe.launch train.py`.
torch is imported lazily, so importing this package never needs torch (the gateway imports
`trainsentry.probe.ras` and friends without it). See docs/probe.md.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from trainsentry.probe.stacks import phase

if TYPE_CHECKING:
    from trainsentry.probe.identity import ProbeConfig
    from trainsentry.probe.runtime import Probe

__all__ = ["current", "phase", "start", "step", "stop"]

log = logging.getLogger("trainsentry.probe")
_lock = threading.Lock()
_probe: Probe | None = None


def start(config: ProbeConfig | None = None) -> Probe | None:
    """Start this rank's probe once (idempotent). Returns None, and logs, if it cannot start."""
    global _probe
    with _lock:
        if _probe is not None:
            return _probe
        try:
            from trainsentry.probe.identity import config_from_env
            from trainsentry.probe.runtime import Probe, prepare_torch_environment

            prepare_torch_environment()
            probe = Probe(config or config_from_env())
            probe.start()
        except Exception as exc:  # training goes on without a probe
            log.warning("event=probe_start_failed error=%r", exc)
            return None
        _probe = probe
        return probe


def step(value: int | None = None) -> None:
    """Advance (or set) the step counter the probe exports. A no-op without a probe."""
    probe = _probe
    if probe is None:
        return
    try:
        probe.step(value)
    except Exception as exc:
        log.debug("event=probe_step_failed error=%r", exc)


def current() -> Probe | None:
    """The running probe of this process, if any."""
    return _probe


def stop() -> None:
    """Stop the probe (tests, clean shutdown)."""
    global _probe
    with _lock:
        probe, _probe = _probe, None
    if probe is not None:
        try:
            probe.stop()
        except Exception as exc:
            log.debug("event=probe_stop_failed error=%r", exc)
