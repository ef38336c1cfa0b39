"""The metric names a PromQL expression reads (pure; for tests).

PromQL's lexical rules (prometheus/prometheus promql/parser/lex.go) make this a small
tokenizer rather than a parser: after comments, string literals, label matchers `{...}`,
range and subquery windows `[...]` and the label lists of `by`, `without`, `on`, `ignoring`,
`group_left` and `group_right` are removed, every identifier that is not a keyword and is
not followed by `(` (a function or an aggregation) is a metric name. A selector written as
`{__name__="x"}` names `x`.
"""

from __future__ import annotations

import re

_COMMENT = re.compile(r"#[^\n]*")
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_NAME_MATCHER = re.compile(r'__name__\s*=\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_WINDOW = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NUMBER_BEFORE = re.compile(r"[0-9.]$")
KEYWORDS = frozenset(
    {
        "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
        "group_left", "group_right", "inf", "nan", "atan2",
    }
)  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Pure: the metric names `expr` selects."""
    text = _COMMENT.sub(" ", expr)
    named = set(_NAME_MATCHER.findall(text))
    text = _STRING.sub('""', text)
    text = _MATCHERS.sub(" ", text)
    text = _WINDOW.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    for match in _IDENT.finditer(text):
        word, rest = match.group(0), text[match.end() :].lstrip()
        if rest.startswith("(") or word.lower() in KEYWORDS:
            continue
        if _NUMBER_BEFORE.search(text[: match.start()]):  # 1e3, 0x1F, 5m: part of a number
            continue
        named.add(word)
    return named
