"""A Prometheus text exposition page, as the stand-in exporters (tests/rules/fixture_exporter.py,
tests/support/node_death_exporter.py) serve it: one `# HELP`/`# TYPE` pair per metric family,
before its first sample, and label values escaped as the text format requires (backslash,
double quote, newline).
"""

from __future__ import annotations


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Page:
    """The samples of one scrape, in the order they were added."""

    def __init__(self, help_text: str = "stand-in") -> None:
        self.help_text = help_text
        self.lines: list[str] = []
        self.seen: set[str] = set()

    def add(self, name: str, kind: str, value: float, **labels: str) -> None:
        if name not in self.seen:
            self.seen.add(name)
            self.lines += [f"# HELP {name} {self.help_text}", f"# TYPE {name} {kind}"]
        rendered = ",".join(f'{key}="{_escape(val)}"' for key, val in labels.items())
        self.lines.append(f"{name}{{{rendered}}} {value}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
