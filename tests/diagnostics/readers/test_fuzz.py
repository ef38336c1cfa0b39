"""Garbage in must give a clear per-file error, never a crash of the whole analysis."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trainsentry.diagnostics.readers.flight_recorder import (
    FlightRecorderError,
    decode_dump,
    read_flight_recorder,
)
from trainsentry.diagnostics.readers.nccl_ras import RasFormatError, parse_ras_json
from trainsentry.diagnostics.synthetic import make_dump

VALID = pickle.dumps(make_dump(0, 4, 5), protocol=4)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_escape_as_other_errors(data: bytes) -> None:
    try:
        decode_dump(data, "f")
    except FlightRecorderError as exc:
        assert "f" in str(exc)


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=len(VALID) - 1), st.integers(0, 255))
@example(position=10, value=128)  # a FRAME length past 2**63: OverflowError, found by CI
@example(position=1018, value=60)  # an entry's time past 2**63 (found in a parallel run)
def test_flipped_byte_in_a_real_pickle(
    tmp_path_factory: pytest.TempPathFactory, position: int, value: int
) -> None:
    data = bytearray(VALID)
    data[position] = value
    path = tmp_path_factory.mktemp("flip") / "rank_0"
    path.write_bytes(bytes(data))
    trace = read_flight_recorder([path])  # must not raise, whatever the byte
    assert len(trace.errors) + len(trace.ranks_with_data) == 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["communicators", "hash", "ranks", "x"]), json_values))
def test_ras_json_shapes(doc: dict[str, object]) -> None:
    try:
        parse_ras_json(doc, "f")
    except RasFormatError as exc:
        assert "f" in str(exc)
