"""What a rank is doing: its Python thread stacks, and whether it is saving a checkpoint.

`/stack` serves `thread_stacks()`; `/status` carries `current_phase()`. Both are read only
on demand (a hang diagnosis asks for the suspects' stacks), never on the poll path.

Invariants:
- Reading stacks never raises into the caller and never holds anything but the GIL, for
  the time it takes to walk the frames (`sys._current_frames()` is a snapshot).
- The answer is bounded: at most `max_frames` frames per thread (the innermost kept) and
  `max_threads` threads, the main thread first; line texts are cut to 200 characters.
- A frame is "library" when its file lies under the interpreter's standard library or
  site-packages (torch included); the innermost non-library frames are the user's code.
"""

from __future__ import annotations

import linecache
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

MAX_FRAMES = 64
MAX_THREADS = 32
_LINE_CHARS = 200

#: Frames whose presence on the main thread means "saving a checkpoint": (file suffix, function
#: names or None for any). torch.save lives in torch/serialization.py; the distributed
#: checkpoint writers under torch/distributed/checkpoint/.
CHECKPOINT_FRAMES: tuple[tuple[str, frozenset[str] | None], ...] = (
    ("torch/serialization.py", frozenset({"save", "_save", "_legacy_save"})),
    ("torch/distributed/checkpoint/", None),
)


def _library_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(sorted(p.rstrip("/") + "/" for p in found if p))


_LIBRARY = _library_prefixes()


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    code: str
    library: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "code": self.code,
            "library": self.library,
        }


def _frames(top: FrameType | None, limit: int) -> list[Frame]:
    """Outermost first, innermost last; only the innermost `limit` are kept."""
    chain: list[FrameType] = []
    frame = top
    while frame is not None and len(chain) < 4096:
        chain.append(frame)
        frame = frame.f_back
    out = []
    for f in reversed(chain[:limit]):
        code = f.f_code
        filename = code.co_filename
        line = f.f_lineno or 0  # None while a frame is between instructions (3.11+)
        try:
            text = linecache.getline(filename, line).strip()[:_LINE_CHARS] if line else ""
        except Exception:  # a source file that cannot be read is no reason to fail
            text = ""
        out.append(Frame(filename, line, code.co_name, text, filename.startswith(_LIBRARY)))
    return out


def thread_stacks(
    max_frames: int = MAX_FRAMES, max_threads: int = MAX_THREADS
) -> list[dict[str, Any]]:
    """Every Python thread's stack, the main thread first (see module invariants)."""
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    order = sorted(frames, key=lambda ident: (ident != main, ident))
    out = []
    for ident in order[:max_threads]:
        thread = threads.get(ident)
        stack = _frames(frames[ident], max_frames)
        out.append(
            {
                "thread": thread.name if thread is not None else f"thread-{ident}",
                "main": ident == main,
                "daemon": bool(thread.daemon) if thread is not None else False,
                "frames": [f.to_dict() for f in stack],
            }
        )
    return out


def in_checkpoint(frames: Sequence[Mapping[str, Any]]) -> bool:
    """Pure: whether a stack (outermost first) is inside torch.save or a distributed
    checkpoint writer."""
    for frame in frames:
        file = str(frame.get("file", "")).replace("\\", "/")
        for suffix, functions in CHECKPOINT_FRAMES:
            if (file.endswith(suffix) or (suffix.endswith("/") and suffix in file)) and (
                functions is None or frame.get("function") in functions
            ):
                return True
    return False


# ------------------------------------------------------------------ marked phases

_phase_lock = threading.Lock()
_phases: list[tuple[str, float]] = []


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark what the rank is doing, e.g. `with trainsentry.probe.phase("checkpoint"):`.

    A hang diagnosis reads it: a rank inside "checkpoint" while its peers wait is saving,
    not hung, until the job's checkpoint limit. Nesting is allowed; the innermost counts.
    """
    entry = (str(name)[:64], time.time())
    with _phase_lock:
        _phases.append(entry)
    try:
        yield
    finally:
        with _phase_lock:
            if entry in _phases:
                _phases.remove(entry)


def current_phase() -> dict[str, Any] | None:
    """The innermost marked phase, else "checkpoint" if the main thread is in one, else None."""
    with _phase_lock:
        marked = _phases[-1] if _phases else None
    if marked is not None:
        return {"name": marked[0], "since": round(marked[1], 3), "source": "marked"}
    main = sys._current_frames().get(threading.main_thread().ident or -1)
    if main is not None and in_checkpoint([f.to_dict() for f in _frames(main, MAX_FRAMES)]):
        return {"name": "checkpoint", "since": None, "source": "stack"}
    return None
