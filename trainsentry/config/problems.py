"""What is wrong with the settings: one error type, `ConfigError`, holding every problem
found, each with its path from the top of the file (`diagnosis.checkpoint_limit_seconds:
Input should be greater than or equal to 5`).

Invariants: a problem never repeats the value it refuses (a refused value may be a secret
written into the YAML, and these messages are logged); list indexes in pydantic's paths are
dotted (`routes.0`), the on-call parser's are bracketed (`layers[0]`), as each part always
wrote them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import yaml
from pydantic import ValidationError


@dataclass(frozen=True, slots=True)
class Problem:
    """One wrong setting: where (`path`, "" for the whole file) and why."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '(settings)'}: {self.message}"


class ConfigError(ValueError):
    """The configuration is invalid; the message says where and why. `problems` holds each
    problem found, with its path (one, without a path, when made from a message alone)."""

    def __init__(self, message: str, problems: Sequence[Problem] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[Problem, ...] = tuple(problems) or (Problem("", message),)

    @classmethod
    def of(cls, problems: Iterable[Problem]) -> ConfigError:
        found = tuple(problems)
        text = "; ".join(str(problem) for problem in found)
        return cls(f"{len(found)} invalid setting(s): {text}", found)


class SectionProblems(ValueError):
    """Raised by a validator that checks several things below the model it validates (a
    section's consistency, references between sections): pydantic reports it as one error
    at the model's path, `problems_of` splits it into one problem per `(path below the
    model, message)`."""

    def __init__(self, problems: Iterable[tuple[str, str]]) -> None:
        self.problems = tuple(problems)
        text = "; ".join(f"{path}: {why}" if path else why for path, why in self.problems)
        super().__init__(text)


def _joined(*parts: str) -> str:
    return ".".join(part for part in parts if part)


def problems_of(exc: ValidationError) -> list[Problem]:
    """Pure: every problem of a failed validation, with its path (never the input)."""
    found: list[Problem] = []
    for error in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in error["loc"])
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, SectionProblems):
            found.extend(Problem(_joined(where, path), text) for path, text in cause.problems)
        else:
            found.append(Problem(where, error["msg"].removeprefix("Value error, ")))
    return found


def describe_invalid(exc: Exception) -> str:
    """What is wrong with a setting, without the value given: a refused value may be a
    secret (a password or a webhook URL written into the YAML), and this text is logged."""
    if isinstance(exc, ValidationError):
        return str(ConfigError.of(problems_of(exc)))
    return str(exc)


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """Pure: a YAML syntax error on one line a person reads: where (line and column, from 1)
    and what PyYAML found wrong, e.g. `line 3, column 2: expected <block end>, but found
    '<block mapping start>' (in the mapping that starts on line 1)`. Never the file's text
    (PyYAML quotes the offending line, which may hold a secret)."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    mark = exc.problem_mark or exc.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    what = exc.problem or exc.context or "not YAML"
    context = ""
    if exc.context and exc.context_mark and exc.problem:
        context = f" ({exc.context} on line {exc.context_mark.line + 1})"
    return f"{where}{what}{context}"
