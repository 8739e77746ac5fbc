"""Metric families as text: OpenMetrics 1.0 (the endpoint) and Prometheus' text format 0.0.4
(node_exporter's textfile collector reads only that one). Pure: no clock, no files.

Both are written from the same `Family` list, so the two outputs always carry the same
series: OpenMetrics' stateset and info types become gauges in 0.0.4 (as
prometheus_client writes them), counters are named `..._total` in both.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[tuple[str, str], ...]


class Kind(enum.StrEnum):
    """An OpenMetrics metric type."""

    GAUGE = "gauge"
    COUNTER = "counter"
    STATESET = "stateset"  # one sample per state: 1 for the current one, 0 for the others
    INFO = "info"  # one sample of value 1 whose labels are the information
    HISTOGRAM = "histogram"  # samples `_bucket` (cumulative, label `le`), `_count`, `_sum`


@dataclass(frozen=True)
class Sample:
    labels: Labels
    value: float
    suffix: str = ""  # a histogram's: "_bucket", "_count" or "_sum"


@dataclass(frozen=True)
class Family:
    """One metric: its name (without `_total`/`_info`), type, help, unit and samples."""

    name: str
    kind: Kind
    help: str
    samples: tuple[Sample, ...]
    unit: str = ""  # OpenMetrics: the name then ends in `_<unit>`

    def sample_name(self) -> str:
        if self.kind is Kind.COUNTER:
            return self.name + "_total"
        if self.kind is Kind.INFO:
            return self.name + "_info"
        return self.name


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int) or (math.isfinite(value) and value == int(value)):
        return str(int(value))
    return repr(float(value))


def _line(name: str, labels: Labels, value: float) -> str:
    inner = ",".join(f'{key}="{_escape(text)}"' for key, text in labels)
    return f"{name}{{{inner}}} {_value(value)}" if inner else f"{name} {_value(value)}"


def openmetrics(families: Sequence[Family]) -> str:
    """The OpenMetrics text of these families, `# EOF` last."""
    lines: list[str] = []
    for f in families:
        lines.append(f"# TYPE {f.name} {f.kind.value}")
        if f.unit:
            lines.append(f"# UNIT {f.name} {f.unit}")
        lines.append(f"# HELP {f.name} {_escape(f.help)}")
        lines += [_line(f.sample_name() + s.suffix, s.labels, s.value) for s in f.samples]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def prometheus_text(families: Sequence[Family]) -> str:
    """Prometheus' text format 0.0.4 of these families (node_exporter's textfile collector)."""
    lines: list[str] = []
    for f in families:
        name = f.sample_name()
        kind = f.kind.value if f.kind in (Kind.COUNTER, Kind.HISTOGRAM) else "gauge"
        help_text = f.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [_line(name + s.suffix, s.labels, s.value) for s in f.samples]
    return "\n".join(lines) + "\n"
