"""The metrics observer (a job `Part`, gpulaunch/parts.py): the job for Prometheus.

It keeps the newest `JobProgress` it was handed and turns it into metric families
(metrics/series.py) only when asked: at a scrape of the endpoint (metrics/server.py),
or every `--metrics-interval` for the textfile (metrics/textfile.py). What the ranks
use is read then (metrics/usage.py), so a job nobody scrapes costs nothing.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Sequence

from gpulaunch.metrics.exposition import OPENMETRICS_TYPE, TEXT_TYPE, openmetrics, prometheus_text
from gpulaunch.metrics.options import MetricsOptions
from gpulaunch.metrics.series import families
from gpulaunch.metrics.server import MetricsServer, bind, bound_address
from gpulaunch.metrics.textfile import TextFile
from gpulaunch.metrics.usage import UsageReader
from gpulaunch.model import AttemptPhases, Goodput, JobProgress, JobReport, RankProgress
from gpulaunch.parts import Controls, Part
from gpulaunch.resources.nvml import Gpus, open_gpus

__all__ = ["MetricsObserver", "MetricsOptions", "metrics_observers"]


def metrics_observers(
    options: MetricsOptions | None,
    say: Callable[[str], None],
    goodput: Callable[[], Goodput | None] = lambda: None,
    phases: Callable[[], Sequence[AttemptPhases]] = tuple,
) -> tuple[MetricsObserver, ...]:
    """The metrics observer where a metrics option was given, else nothing at all;
    `goodput`, `phases`: the job's so far (progress/timeline.py)."""
    if options is None or not options.wanted:
        return ()
    return (MetricsObserver(options, say, goodput=goodput, phases=phases),)


class MetricsObserver(Part):
    """Serves and/or writes the job's metrics while it runs."""

    def __init__(
        self,
        options: MetricsOptions,
        say: Callable[[str], None],
        node: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        gpus: Gpus | str | None = None,
        goodput: Callable[[], Goodput | None] = lambda: None,
        phases: Callable[[], Sequence[AttemptPhases]] = tuple,
    ) -> None:
        self.options = options
        self.goodput = goodput
        self.phases = phases
        self.say = say
        self.node = node or socket.gethostname()
        self.clock = clock
        self._gpus = gpus
        self.job: JobProgress | None = None
        self.server: MetricsServer | None = None
        self.textfile: TextFile | None = None
        self.usage: UsageReader | None = None
        self._timer: asyncio.TimerHandle | None = None

    def attach(self, job: JobProgress, controls: Controls, loop: asyncio.AbstractEventLoop) -> None:
        self.job = job
        # Bad options fail here, before the job's units exist: nothing is left behind.
        if self.options.textfile is not None:
            self.textfile = TextFile(self.options.textfile, job.spec.names.component)
        if self.options.listen is not None:
            try:
                sock = bind(self.options.listen)
            except BaseException:
                if self.textfile is not None:
                    self.textfile.remove()
                raise
            self.server = MetricsServer(sock, self.render)
            loop.run_until_complete(self.server.start())
        gpus = open_gpus() if self._gpus is None else self._gpus
        self.usage = UsageReader(gpus if isinstance(gpus, Gpus) else None)
        where = [f"http://{bound_address(self.server.sock)}/metrics"] if self.server else []
        where += [str(self.textfile.path)] if self.textfile else []
        self.say(f"gpulaunch: job {job.spec.job}: metrics at {' and '.join(where)}")
        if self.textfile is not None:
            self._write(loop)

    def changed(self, job: JobProgress, rank: RankProgress | None) -> None:
        self.job = job

    async def finished(self, job: JobProgress, report: JobReport) -> None:
        self.job = job
        if self.server is not None:
            await self.server.aclose()
        self.close()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.textfile is not None:
            self.textfile.remove()
            self.textfile = None
        if self.usage is not None:
            self.usage.close()
            self.usage = None

    def text(self, open_metrics: bool) -> str:
        """The job's metrics now, in either format."""
        assert self.job is not None and self.usage is not None
        uses = self.usage.read(self.job.ranks, self.job.watcher_pid)
        found = families(self.job, uses, self.node, self.clock(), self.goodput(), self.phases())
        return openmetrics(found) if open_metrics else prometheus_text(found)

    def render(self, open_metrics: bool) -> tuple[bytes, str]:
        return self.text(open_metrics).encode(), OPENMETRICS_TYPE if open_metrics else TEXT_TYPE

    def _write(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.textfile is None:
            return
        problem = self.textfile.write(self.text(open_metrics=False))
        if problem is not None:
            self.say(f"gpulaunch: warning: {problem}")
        self._timer = loop.call_later(self.options.interval, self._write, loop)
