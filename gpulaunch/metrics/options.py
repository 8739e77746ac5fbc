"""`start --metrics-listen/--metrics-textfile/--metrics-interval` (gpulaunch/metrics/).

Light on purpose: cli.py imports it for every command.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.errors import UsageError

DEFAULT_INTERVAL = 15.0  # seconds between two writes of the textfile (node_exporter's pace)


LOOPBACK = "127.0.0.1"  # `--metrics-listen PORT`: this machine only; an address is a choice


@dataclass(frozen=True)
class Listen:
    """Where the endpoint listens: `host` "::" is every address (IPv6 and IPv4)."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class MetricsOptions:
    """None: not asked for; nothing of gpulaunch/metrics/ runs then."""

    listen: Listen | None = None
    textfile: Path | None = None
    interval: float = DEFAULT_INTERVAL

    @property
    def wanted(self) -> bool:
        return self.listen is not None or self.textfile is not None


_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def _host(host: str) -> str:
    """An IP address or a DNS name (RFC 1123: labels of 1-63 letters, digits, hyphens; 253 in
    all), else ArgumentTypeError: a name the resolver would choke on is one line here."""
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host))
    labels = host.removesuffix(".").split(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        shown = host if len(host) <= 60 else host[:60] + "..."
        raise argparse.ArgumentTypeError(
            f"not a host name or IP address: {ascii(shown)} (want PORT, ADDR:PORT or [IPv6]:PORT)"
        )
    return host


def parse_listen(text: str) -> Listen:
    """`PORT` or `:PORT` (loopback only), `ADDR:PORT`, `[IPv6]:PORT`; port 0: any free one.
    Every address is an explicit choice: `0.0.0.0:PORT` (IPv4) or `[::]:PORT` (both)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            raise argparse.ArgumentTypeError(f"brackets are for an IPv6 address, not {host!r}")
    elif ":" in host:
        raise argparse.ArgumentTypeError(f"write an IPv6 address in brackets: [{host}]:{port}")
    if not port.isascii() or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"not a port: {ascii(port)} (want PORT, ADDR:PORT or [IPv6]:PORT, port 0-65535)"
        )
    return Listen(_host(host) if host else LOOPBACK, int(port))


def _interval(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 1 <= seconds < 1e6:
        raise argparse.ArgumentTypeError(f"must be at least 1 second and finite, not {text!r}")
    return seconds


def add_metrics_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-listen",
        type=parse_listen,
        metavar="[ADDR:]PORT",
        help="serve the job's metrics for Prometheus (OpenMetrics) on this address while it "
        "runs: PORT alone listens on this machine only (127.0.0.1), 0.0.0.0:PORT or [::]:PORT "
        "on every address",
    )
    p.add_argument(
        "--metrics-textfile",
        type=Path,
        metavar="DIR",
        help="write the job's metrics to DIR/gpulaunch-JOB.prom for node_exporter's textfile "
        "collector while it runs (removed at its end)",
    )
    p.add_argument(
        "--metrics-interval",
        type=_interval,
        metavar="SECONDS",
        help=f"how often --metrics-textfile is written (default {DEFAULT_INTERVAL:g})",
    )


def metrics_options(args: argparse.Namespace) -> MetricsOptions:
    """The options as given; `--metrics-interval` alone is a mistake said at once."""
    if args.metrics_interval is not None and args.metrics_textfile is None:
        raise UsageError(
            "--metrics-interval is how often --metrics-textfile is written",
            "give --metrics-textfile DIR too (the endpoint is read when scraped)",
        )
    interval = args.metrics_interval or DEFAULT_INTERVAL
    return MetricsOptions(args.metrics_listen, args.metrics_textfile, interval)
