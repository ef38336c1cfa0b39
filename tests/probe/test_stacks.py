"""What a rank is doing: its stack as the probe reads it (trainsentry/probe/stacks.py)."""

from __future__ import annotations


def test_a_frame_without_a_line_number_is_still_described() -> None:
    """Python 3.11+ reports f_lineno None for a frame between instructions (seen under load:
    /stack answered 500); linecache.getline(file, None) raises TypeError."""
    from types import SimpleNamespace

    from trainsentry.probe import stacks

    code = SimpleNamespace(co_filename=__file__, co_name="load_batch")
    frame = SimpleNamespace(f_code=code, f_lineno=None, f_back=None)
    (described,) = stacks._frames(frame, 8)  # type: ignore[arg-type]
    assert (described.function, described.line, described.code) == ("load_batch", 0, "")
