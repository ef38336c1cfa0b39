"""Regular expressions that people write (maintenance windows, the policy's rules and routes,
its infrastructure and node-health alertname patterns): the one place they are compiled and
matched.

They are matched against alert labels, which any team shapes, on the gateway's event loop;
so they run with RE2 (google-re2), whose time is linear in the text: no backtracking, no
pattern that a crafted label can make run for seconds (Python's `re` took 13-31 s for
`(a+)+` on 28 `a`s and a `!`, issue 32).

Semantics are Alertmanager's regex matchers: RE2 syntax (Alertmanager is Go, whose `regexp`
is RE2's; its docs, configuration.md: "`<regex>`: any valid RE2 regular expression (The
regex is anchored on both ends ...)") and anchored at both ends (pkg/labels/matcher.go
compiles `"^(?:" + v + ")$"`). Here the pattern is compiled alone and matched with a full
match, the same answer, and a pattern such as `a)|(b` is refused instead of changing the
wrapper's meaning. Differences from Python's `re`: no look-around, no back-references;
`\\d`, `\\w` and `\\s` are ASCII.

Bounds, so that one match takes milliseconds at most (tests/test_userregex.py measures it):
- a pattern longer than MAX_PATTERN_CHARS characters is refused, and so is one whose RE2
  program has more than MAX_PROGRAM_SIZE instructions (a large counted repetition such as
  `.{0,200}` or `(a?){500}`: RE2's time is linear in the text times the program);
- a value is matched on its first MAX_VALUE_CHARS characters (a label value longer than
  that matches as if cut there).

Pure: no I/O; compiled patterns and their answers are memoised, which changes no answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import re2

MAX_PATTERN_CHARS = 1000
MAX_PROGRAM_SIZE = 1000
MAX_VALUE_CHARS = 1024

__all__ = [
    "MAX_PATTERN_CHARS",
    "MAX_PROGRAM_SIZE",
    "MAX_VALUE_CHARS",
    "RegexRefused",
    "UserRegex",
    "check_user_regex",
    "compile_user_regex",
    "full_match",
]


class RegexRefused(ValueError):
    """The pattern cannot be used; the message says why (without naming the field: the
    caller knows where the pattern came from)."""


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # RE2 would print each refused pattern on stderr
    options.never_capture = True  # only "does it match": the DFA alone answers that
    return options


_OPTIONS = _options()


@dataclass(frozen=True, slots=True)
class UserRegex:
    """A compiled user pattern. Equal (and hashed) by its text."""

    pattern: str
    _match: Callable[[str], object] = field(compare=False, repr=False)

    def fullmatch(self, value: str) -> bool:
        """Pure: the whole value (its first MAX_VALUE_CHARS characters) matches."""
        text = value[:MAX_VALUE_CHARS]
        try:
            return self._match(text) is not None
        except UnicodeEncodeError:  # a lone surrogate: RE2 reads UTF-8
            return self._match(text.encode("utf-8", "replace").decode("utf-8")) is not None

    @property
    def matches_empty(self) -> bool:
        """Pure: the empty string (a label the alert lacks) matches."""
        return self.fullmatch("")


@lru_cache(maxsize=2048)
def compile_user_regex(pattern: str) -> UserRegex:
    """Pure: `pattern` compiled for full matches; RegexRefused says why it cannot be."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise RegexRefused(f"longer than {MAX_PATTERN_CHARS} characters")
    try:
        compiled = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raw = exc.args[0] if exc.args else exc
        reason = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        raise RegexRefused(f"not a regular expression (RE2 syntax): {reason[:200]}") from None
    except UnicodeEncodeError:
        raise RegexRefused("not a regular expression: holds a lone surrogate") from None
    if compiled.programsize > MAX_PROGRAM_SIZE:
        raise RegexRefused(
            f"too large: {compiled.programsize} RE2 instructions, more than {MAX_PROGRAM_SIZE}"
            " (shrink its counted repetitions, such as .{0,200})"
        )
    return UserRegex(pattern, compiled.fullmatch)


def check_user_regex(pattern: str) -> str:
    """Pure: `pattern` itself when it compiles (for validators); RegexRefused otherwise."""
    compile_user_regex(pattern)
    return pattern


# (pattern, value) -> whether it matches: the policy asks the same few questions of every
# alert of a storm (its alertname against each rule). Bounded; values longer than
# MAX_VALUE_CHARS are never kept (they are matched on their first MAX_VALUE_CHARS anyway).
_ANSWERS: dict[tuple[str, str], bool] = {}
_ANSWERS_MAX = 8192


def full_match(pattern: str, value: str) -> bool:
    """Pure: `value` fully matches `pattern`, which must compile (validated where it was
    read): RegexRefused otherwise. Answers are memoised (bounded), which changes none."""
    key = (pattern, value)
    found = _ANSWERS.get(key)
    if found is None:
        found = compile_user_regex(pattern).fullmatch(value)
        if len(value) <= MAX_VALUE_CHARS:
            if len(_ANSWERS) >= _ANSWERS_MAX:
                _ANSWERS.clear()
            _ANSWERS[key] = found
    return found
