"""The regular expressions people write (trainsentry/userregex.py): Alertmanager's semantics
(RE2 syntax, anchored at both ends), linear time on the patterns and labels that froze the
gateway with Python's `re` (issue 32 finding 2), and clear refusals.

The match cases are Alertmanager's own (pkg/labels/matcher_test.go, TestMatcher, the
MatchRegexp rows: Alertmanager compiles `"^(?:" + v + ")$"` with Go's RE2 `regexp`).
"""

from __future__ import annotations

import time

import pytest

from trainsentry.userregex import (
    MAX_PATTERN_CHARS,
    MAX_PROGRAM_SIZE,
    MAX_VALUE_CHARS,
    RegexRefused,
    compile_user_regex,
    full_match,
)

ALERTMANAGER_CASES = [
    ("bar", "bar", True),
    ("bar", "foo-bar", False),
    (".*bar", "foo-bar", True),
    ("foo.bar", "foo-bar", True),
    (r"foo\.bar", "foo-bar", False),
    (r"foo\.bar", "foo.bar", True),
    ("foo.bar", "foo\nbar", False),
    ("(?s)foo.bar", "foo\nbar", True),
]


@pytest.mark.parametrize(("pattern", "value", "expected"), ALERTMANAGER_CASES)
def test_alertmanager_regex_matcher_cases(pattern: str, value: str, expected: bool) -> None:
    assert full_match(pattern, value) is expected


def test_anchored_at_both_ends_and_re2_classes() -> None:
    node = compile_user_regex("gpu-node-1[0-9]")
    assert node.fullmatch("gpu-node-17")
    assert not node.fullmatch("gpu-node-170") and not node.fullmatch("xgpu-node-17")
    # RE2's (and Go's) \d is [0-9]; Python's re also took other scripts' digits
    assert full_match(r"\d+", "17") and not full_match(r"\d+", "١٧")
    assert full_match("(?i)dbe", "DBE")
    # an alternation stays inside the anchors ("^(?:a|b)$", not "^a|b$")
    assert not full_match("a|b", "ab") and not full_match("a|b", "xb")


# (pattern, label): the reproductions, then the textbook catastrophic shapes, each
# with a label that makes a backtracking engine try exponentially many ways.
PATHOLOGICAL = [
    ("(a+)+", "a" * 28 + "!"),
    ("([a-z0-9-]+)+-17", "a" * 18),
    ("(a|aa)+", "a" * 40 + "!"),
    ("(a|a?)+b", "a" * 40),
    ("(.*a){20}", "a" * 40 + "!"),
    ("(x+x+)+y", "x" * MAX_VALUE_CHARS),
    ("(\\w+\\s?)+$", "word " * 200 + "!"),
]


@pytest.mark.parametrize(("pattern", "label"), PATHOLOGICAL)
def test_pathological_patterns_run_in_linear_time(pattern: str, label: str) -> None:
    regex = compile_user_regex(pattern)
    started = time.perf_counter()
    for _ in range(100):
        assert not regex.fullmatch(label)
    # Python's re: 13-31 s for the first row alone (issue 32); RE2: well under 1 ms each.
    assert time.perf_counter() - started < 0.5


def test_the_largest_allowed_program_on_the_longest_value_takes_milliseconds() -> None:
    """RE2 is linear in the text times the program: the bounds keep one match small. These
    patterns sit at the program cap and make RE2's DFA build a new state per character."""
    value = "ab" * MAX_VALUE_CHARS  # cut to MAX_VALUE_CHARS before matching
    worst = 0.0
    for pattern in ("[ab]*a[ab]{990}c", "(a?){330}a{330}", ".{0,100}x"):
        regex = compile_user_regex(pattern)
        started = time.perf_counter()
        regex.fullmatch(value)
        worst = max(worst, time.perf_counter() - started)
    assert worst < 0.25  # measured about 4 ms on an idle core


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("gpu-([", "not a regular expression (RE2 syntax): missing ]"),
        ("DBE(?![a-z])", "invalid perl operator: (?!"),  # no look-ahead in RE2
        (r"(a)\1", r"invalid escape sequence: \1"),  # no back-references
        ("a)|(b", "unexpected )"),  # would change the meaning of a "^(?:...)$" wrapper
        ("a{1001}", "invalid repetition size"),
        ("x" * (MAX_PATTERN_CHARS + 1), f"longer than {MAX_PATTERN_CHARS} characters"),
        (".{0,200}", f"more than {MAX_PROGRAM_SIZE}"),
        ("(a?){999}", f"more than {MAX_PROGRAM_SIZE}"),
        ("gpu-\ud800", "lone surrogate"),
    ],
)
def test_refused_patterns_say_why(pattern: str, reason: str) -> None:
    with pytest.raises(RegexRefused) as caught:
        compile_user_regex(pattern)
    assert reason in str(caught.value)


def test_values_are_matched_on_their_first_characters() -> None:
    long_value = "gpu-" + "a" * (MAX_VALUE_CHARS * 4)
    assert full_match("gpu-a*", long_value)
    assert not full_match(".*b", long_value[:-1] + "b")  # the b is past the cap
    assert full_match(".*b", "a" * (MAX_VALUE_CHARS - 1) + "b")
    # a lone surrogate (JSON may carry one) reads as U+FFFD, not an exception
    assert full_match("gpu-.", "gpu-\udc80")


def test_empty_string_matchers() -> None:
    # Alertmanager's silence_test.go refuses {a=""} with {b=~".*"}: both match ""
    assert compile_user_regex(".*").matches_empty
    assert compile_user_regex("|x").matches_empty
    assert compile_user_regex("(gpu-.*)?").matches_empty
    assert not compile_user_regex(".+").matches_empty
    assert not compile_user_regex("gpu-.*").matches_empty


def test_compiled_patterns_compare_by_text() -> None:
    assert compile_user_regex("a.*") == compile_user_regex("a.*")
    assert {compile_user_regex("a.*"), compile_user_regex("b")} == {
        compile_user_regex("b"),
        compile_user_regex("a.*"),
    }
