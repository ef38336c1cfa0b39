"""Kubernetes object names, checked by Kubernetes' own rules where they enter. Pure.

The rules are those of k8s.io/apimachinery: `util/validation` (IsDNS1123Label,
IsDNS1123Subdomain) and `api/validation/path` (IsValidPathSegmentName):
- most objects (Secrets, ConfigMaps, Pods, Nodes, Events, custom resources) are named by
  a DNS-1123 subdomain: at most 253 characters, lower-case alphanumerics, '-' and '.',
  starting and ending with an alphanumeric, no empty part between dots;
- a namespace is a DNS-1123 label: at most 63 characters, lower-case alphanumerics and '-',
  starting and ending with an alphanumeric;
- any name that is a path segment may not be '.' or '..' nor contain '/' or '%' (a
  subdomain or label never does; the path builder checks that on its own).

Invariant: a name these functions pass is one the API server would accept, and it contains
nothing an HTTP client or server could read as a path separator, a dot segment or an
escape. The length is checked before any pattern, so a long input costs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = rf"{_LABEL}(\.{_LABEL})*"
DNS1123_LABEL = re.compile(_LABEL)
DNS1123_SUBDOMAIN = re.compile(_SUBDOMAIN)
# The same rule as a JSON Schema pattern (the CRD's `pattern`, anchored as it must be).
DNS1123_SUBDOMAIN_PATTERN = f"^{_SUBDOMAIN}$"

LABEL_RULE = (
    "a DNS-1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name')"
)
SUBDOMAIN_RULE = (
    "a DNS-1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com')"
)
NOT_PATH_SEGMENTS = (".", "..")
NOT_IN_PATH_SEGMENTS = ("/", "%")
_SHOWN = 80  # characters of a refused value quoted in a message


class InvalidName(ValueError):
    """A name or namespace Kubernetes would not accept: refused before any request is made.
    The message quotes the value (cut to 80 characters) and says which rule it breaks."""

    def __init__(self, what: str, value: object, problems: Sequence[str]) -> None:
        shown = repr(value[:_SHOWN] if isinstance(value, str) else value)[: _SHOWN + 2]
        super().__init__(f"{what} {shown} is not a valid Kubernetes name: {'; '.join(problems)}")
        self.what = what
        self.problems = tuple(problems)


def _empty_or_long(value: str, limit: int) -> list[str]:
    if not value:
        return ["must be non-empty"]
    if len(value) > limit:
        return [f"must be no more than {limit} characters"]
    return []


def label_problems(value: str) -> list[str]:
    """Pure: why `value` is not a DNS-1123 label (IsDNS1123Label); [] when it is one."""
    return _empty_or_long(value, DNS1123_LABEL_MAX) or (
        [] if DNS1123_LABEL.fullmatch(value) else [LABEL_RULE]
    )


def subdomain_problems(value: str) -> list[str]:
    """Pure: why `value` is not a DNS-1123 subdomain (IsDNS1123Subdomain); [] when it is."""
    return _empty_or_long(value, DNS1123_SUBDOMAIN_MAX) or (
        [] if DNS1123_SUBDOMAIN.fullmatch(value) else [SUBDOMAIN_RULE]
    )


def path_segment_problems(value: str) -> list[str]:
    """Pure: why `value` cannot be a name in an API path (IsValidPathSegmentName, and not
    empty); [] when it can."""
    if not value:
        return ["must be non-empty"]
    if value in NOT_PATH_SEGMENTS:
        return [f"may not be '{value}'"]
    return [f"may not contain '{bad}'" for bad in NOT_IN_PATH_SEGMENTS if bad in value]


def check_name(value: object, what: str = "name") -> str:
    """`value` when it is a DNS-1123 subdomain (an object's name), else InvalidName."""
    if not isinstance(value, str):
        raise InvalidName(what, value, ["must be a string"])
    if problems := subdomain_problems(value):
        raise InvalidName(what, value, problems)
    return value


def check_namespace(value: object, what: str = "namespace") -> str:
    """`value` when it is a DNS-1123 label (a namespace's name), else InvalidName."""
    if not isinstance(value, str):
        raise InvalidName(what, value, ["must be a string"])
    if problems := label_problems(value):
        raise InvalidName(what, value, problems)
    return value
