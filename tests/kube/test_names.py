"""Kubernetes name rules (trainsentry/kube/names.py), with the cases of Kubernetes' own tests:
k8s.io/apimachinery/pkg/util/validation/validation_test.go (TestIsDNS1123Label,
TestIsDNS1123Subdomain) and pkg/api/validation/path/name_test.go
(TestValidatePathSegmentName)."""

from __future__ import annotations

import time

import pytest

from trainsentry.kube.names import (
    DNS1123_SUBDOMAIN_PATTERN,
    InvalidName,
    check_name,
    check_namespace,
    label_problems,
    path_segment_problems,
    subdomain_problems,
)

# TestIsDNS1123Label
LABEL_GOOD = [
    "a", "ab", "abc", "a1", "a-1", "a--1--2--b",
    "0", "01", "012", "1a", "1-a", "1--a--b--2",
    "a" * 63,
]  # fmt: skip
LABEL_BAD = [
    "", "A", "ABC", "aBc", "A1", "A-1", "1-A",
    "-", "a-", "-a", "1-", "-1",
    "_", "a_", "_a", "a_b", "1_", "_1", "1_2",
    ".", "a.", ".a", "a.b", "1.", ".1", "1.2",
    " ", "a ", " a", "a b", "1 ", " 1", "1 2",
    "a" * 64,
]  # fmt: skip
# TestIsDNS1123Subdomain
SUBDOMAIN_GOOD = [
    "a", "ab", "abc", "a1", "a-1", "a--1--2--b",
    "0", "01", "012", "1a", "1-a", "1--a--b--2",
    "a.a", "ab.a", "abc.a", "a1.a", "a-1.a", "a--1--2--b.a",
    "a.1", "ab.1", "abc.1", "a1.1", "a-1.1", "a--1--2--b.1",
    "0.a", "01.a", "012.a", "1a.a", "1-a.a", "1--a--b--2",
    "0.1", "01.1", "012.1", "1a.1", "1-a.1", "1--a--b--2.1",
    "a.b.c.d.e", "aa.bb.cc.dd.ee", "1.2.3.4.5", "11.22.33.44.55",
    "a" * 253,
]  # fmt: skip
SUBDOMAIN_BAD = [
    "", "A", "ABC", "aBc", "A1", "A-1", "1-A",
    "-", "a-", "-a", "1-", "-1",
    "_", "a_", "_a", "a_b", "1_", "_1", "1_2",
    ".", "a.", ".a", "a..b", "1.", ".1", "1..2",
    " ", "a ", " a", "a b", "1 ", " 1", "1 2",
    "A.a", "aB.a", "ab.A", "A1.a", "a1.A",
    "A.1", "aB.1", "A1.1", "1A.1",
    "0.A", "01.A", "012.A", "1A.a", "1a.A",
    "A.B.C.D.E", "AA.BB.CC.DD.EE", "a.B.c.d.e", "aa.bB.cc.dd.ee",
    "a@b", "a,b", "a_b", "a;b",
    "a:b", "a%b", "a?b", "a$b",
    "a" * 254,
]  # fmt: skip
# Ours: the escapes of issue 32 and what a regex's `$` would let through.
ESCAPES = [
    "..", "../../team-b/secrets/bot", "%2e%2e/%2e%2e/team-b/secrets/bot",
    "../namespaces/kube-system/secrets/x", "bot/x", "bot%2Fx", "bot\n", "bot\x00", "bøt",
]  # fmt: skip


@pytest.mark.parametrize("value", LABEL_GOOD)
def test_dns1123_labels_kubernetes_accepts(value: str) -> None:
    assert label_problems(value) == []
    assert check_namespace(value) == value


@pytest.mark.parametrize("value", LABEL_BAD + ESCAPES)
def test_dns1123_labels_kubernetes_refuses(value: str) -> None:
    assert label_problems(value)
    with pytest.raises(InvalidName, match=r"namespace .* is not a valid Kubernetes name"):
        check_namespace(value)


@pytest.mark.parametrize("value", SUBDOMAIN_GOOD)
def test_dns1123_subdomains_kubernetes_accepts(value: str) -> None:
    assert subdomain_problems(value) == []
    assert check_name(value) == value


@pytest.mark.parametrize("value", SUBDOMAIN_BAD + ESCAPES)
def test_dns1123_subdomains_kubernetes_refuses(value: str) -> None:
    assert subdomain_problems(value)
    with pytest.raises(InvalidName, match=r"Secret name .* is not a valid Kubernetes name"):
        check_name(value, "Secret name")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "must be non-empty"),
        ("foo.bar.baz", ""),
        ("sha256:ABCDEF012345@ABCDEF012345", ""),  # no DNS name, but a usable path segment
        ("Iñtërnâtiônàlizætiøn", ""),
        (".", "may not be '.'"),
        (".test", ""),
        ("..", "may not be '..'"),
        ("..test", ""),
        ("foo/bar", "may not contain '/'"),
        ("foo%bar", "may not contain '%'"),
        ("foo//bar%", "may not contain '/'; may not contain '%'"),
    ],
)
def test_path_segment_names_as_kubernetes_checks_them(value: str, expected: str) -> None:
    assert "; ".join(path_segment_problems(value)) == expected


def test_the_error_names_the_rule_and_quotes_the_value_bounded() -> None:
    with pytest.raises(InvalidName) as caught:
        check_name("../../team-b/secrets/bot", "Secret name")
    message = str(caught.value)
    assert message.startswith("Secret name '../../team-b/secrets/bot' is not a valid")
    assert "DNS-1123 subdomain" in message and caught.value.what == "Secret name"
    assert isinstance(caught.value, ValueError)
    with pytest.raises(InvalidName) as caught:
        check_name("x" * 100_000)
    assert len(str(caught.value)) < 300 and "no more than 253 characters" in str(caught.value)
    with pytest.raises(InvalidName, match="must be a string"):
        check_name(7)
    with pytest.raises(InvalidName, match="must be a string"):
        check_namespace(None)


def test_a_long_hostile_name_costs_nothing() -> None:
    hostile = ["a" * 252 + "-", "a-" * 126 + "!", "a." * 126 + "-", "-" * 10_000_000]
    started = time.perf_counter()
    for value in hostile:
        assert subdomain_problems(value) and label_problems(value)
    assert time.perf_counter() - started < 0.05


def test_the_schema_patterns_say_the_same() -> None:
    """The CRD's `pattern` (JSON Schema: a search, so anchored) is the same rule."""
    import re

    for value in SUBDOMAIN_GOOD:
        assert re.search(DNS1123_SUBDOMAIN_PATTERN, value)
    for value in SUBDOMAIN_BAD:
        if len(value) <= 253:
            assert not re.search(DNS1123_SUBDOMAIN_PATTERN, value), value
