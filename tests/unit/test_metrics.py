"""Metrics for Prometheus (issue 26 item 4): the series, both text formats read back by
prometheus_client's parsers, the endpoint over real sockets, the textfile's writes, the
cgroup reads on a fake tree; the Grafana dashboard's queries against a real exposition.
The running job: tests/integration/test_metrics.py."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

from gpulaunch.base.names import UnitNames
from gpulaunch.errors import UnavailableError, UsageError
from gpulaunch.metrics.exposition import Kind, openmetrics, prometheus_text
from gpulaunch.metrics.observer import MetricsObserver, metrics_observers
from gpulaunch.metrics.options import (
    Listen,
    MetricsOptions,
    add_metrics_options,
    metrics_options,
    parse_listen,
)
from gpulaunch.metrics.series import families
from gpulaunch.metrics.server import MAX_CLIENTS, MAX_HEAD, MetricsServer, bind, bound_address
from gpulaunch.metrics.textfile import TextFile
from gpulaunch.metrics.usage import RankUse, UsageReader
from gpulaunch.model import (
    AttemptPhases,
    Cause,
    Goodput,
    JobProgress,
    JobReport,
    JobSpec,
    Loss,
    Manager,
    Phase,
    RankExit,
    RankProgress,
    RankSpec,
    RankState,
    StepInfo,
)
from gpulaunch.parts import Controls

GOODPUT = Goodput(60.0, 45.0, 5.0, (Loss(0, 2.0, 1.0, 0.5, 6.5),), checkpoints=True)
PHASES = (
    AttemptPhases(0, "start", (("ranks_forked", 0.5),)),
    AttemptPhases(1, "failure", (("failure_seen", 0.0), ("ranks_stopped", 0.25))),
)
JOB = 'train "big"\\x'  # quotes and a backslash: escaped in label values


def spec(nproc: int = 3) -> JobSpec:
    names = UnitNames.for_job(JOB)
    ranks = tuple(
        RankSpec(rank=10 + i, local_rank=i, unit=f"u{i}.scope", argv=("x",), env={})
        for i in range(nproc)
    )
    return JobSpec(
        job=JOB,
        names=names,
        manager=Manager.USER,
        argv=("x",),
        cwd="/",
        nproc=nproc,
        world_size=16,
        master_addr="127.0.0.1",
        master_port=1,
        grace_sec=1,
        ranks=ranks,
    )


def progress() -> JobProgress:
    """Rank 10 steps (a straggler, total known), rank 11 runs without steps, rank 12 ended."""
    s = spec()
    steps = StepInfo(
        step=40, total=100, at=95.0, steps_per_second=2.0, step_seconds=0.5, straggler=True
    )
    ended = RankExit(code=3, signal=None, stopped_by_watcher=False, observed_at=1, runtime=1)
    ranks = (
        RankProgress(10, 0, "u0.scope", RankState.RUNNING, 101, False, None, steps=steps),
        RankProgress(11, 1, "u1.scope", RankState.RUNNING, 102, False, None),
        RankProgress(12, 2, "u2.scope", RankState.EXITED, 103, False, ended),
    )
    return JobProgress(s, Phase.RUNNING, ranks, attempt=2, watcher_pid=100)


USES = {
    10: RankUse(cpu_seconds=12.5, memory=None, rss=3 << 20, processes=2, gpu_memory=1 << 30),
    11: RankUse(cpu_seconds=1.0, memory=5 << 20, rss=4 << 20, processes=2, gpu_util=35),
}


def samples(
    text: str, open_metrics: bool = True
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    parse = om_parse if open_metrics else text_parse
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in parse(text)
        for s in family.samples
    }


def labels(rank: int | None = None, **more: str) -> frozenset[tuple[str, str]]:
    base = {"job": JOB, "node": "n1", **more}
    if rank is not None:
        base["rank"] = str(rank)
    return frozenset(base.items())


@pytest.mark.parametrize("open_metrics", [True, False], ids=["openmetrics", "text-0.0.4"])
def test_the_series_parse_with_their_labels_and_values(open_metrics: bool) -> None:
    found = families(progress(), USES, "n1", now=100.0)
    text = openmetrics(found) if open_metrics else prometheus_text(found)
    got = samples(text, open_metrics)
    assert got[("gpulaunch_job_restarts_total", labels())] == 2
    assert got[("gpulaunch_job_ranks", labels())] == 3
    assert got[("gpulaunch_job_phase", labels(gpulaunch_job_phase="running"))] == 1
    assert got[("gpulaunch_job_phase", labels(gpulaunch_job_phase="stopping"))] == 0
    info = "gpulaunch_job_info"
    assert got[(info, labels(manager="user", world_size="16"))] == 1
    state = "gpulaunch_rank_state"
    assert got[(state, labels(10, gpulaunch_rank_state="running"))] == 1
    assert got[(state, labels(10, gpulaunch_rank_state="exited"))] == 0
    assert got[(state, labels(12, gpulaunch_rank_state="exited"))] == 1
    assert got[("gpulaunch_rank_exit_status", labels(12))] == 3
    assert got[("gpulaunch_rank_cpu_seconds_total", labels(10))] == 12.5
    assert got[("gpulaunch_rank_resident_memory_bytes", labels(11))] == 4 << 20
    assert got[("gpulaunch_rank_memory_bytes", labels(11))] == 5 << 20
    assert got[("gpulaunch_rank_gpu_memory_bytes", labels(10))] == 1 << 30
    assert got[("gpulaunch_rank_gpu_utilization_ratio", labels(11))] == 0.35
    # steps: only rank 10 reports them
    assert got[("gpulaunch_rank_step", labels(10))] == 40
    assert got[("gpulaunch_rank_steps_expected", labels(10))] == 100
    assert got[("gpulaunch_rank_steps_per_second", labels(10))] == 2
    assert got[("gpulaunch_rank_step_duration_seconds", labels(10))] == 0.5
    assert got[("gpulaunch_rank_last_step_age_seconds", labels(10))] == 5
    assert got[("gpulaunch_rank_eta_seconds", labels(10))] == 30
    assert got[("gpulaunch_rank_straggler", labels(10))] == 1
    # what nobody can tell has no series, never a 0
    assert ("gpulaunch_rank_memory_bytes", labels(10)) not in got
    assert not any(name == "gpulaunch_rank_step" and ("rank", "11") in ls for name, ls in got)
    assert not any(("rank", "12") in ls and name.endswith("cpu_seconds_total") for name, ls in got)


def test_a_ranks_gpu_series_carry_dcgms_gpu_labels() -> None:
    """`gpu` and `UUID` as dcgm-exporter labels its series: a query can join them."""
    uuid = "GPU-0a0a0a0a-1111-2222-3333-444444444444"
    job = progress()
    ranks = list(job.spec.ranks)
    ranks[0] = replace(ranks[0], gpu=3, env={"CUDA_VISIBLE_DEVICES": uuid})
    ranks[1] = replace(ranks[1], gpu=4, env={"CUDA_VISIBLE_DEVICES": "4"})  # index only
    job = replace(job, spec=replace(job.spec, ranks=tuple(ranks)))
    got = samples(openmetrics(families(job, USES, "n1", now=100.0)))
    memory = ("gpulaunch_rank_gpu_memory_bytes", labels(10, gpu="3", UUID=uuid))
    assert got[memory] == 1 << 30
    assert got[("gpulaunch_rank_gpu_utilization_ratio", labels(11, gpu="4"))] == 0.35
    assert got[("gpulaunch_rank_cpu_seconds_total", labels(10))] == 12.5  # no GPU labels


def test_docs_metrics_lists_exactly_the_series_served() -> None:
    """A new series is a row of docs/metrics.md too (docs/architecture.md, "How to add")."""
    found = families(progress(), USES, "n1", 100.0, GOODPUT, PHASES)
    histograms = {f.name for f in found if f.kind is Kind.HISTOGRAM}  # (_bucket, _count, _sum)
    served = histograms | {
        name
        for name, _ in samples(openmetrics(found))
        if not any(name.startswith(h + "_") for h in histograms)
    }
    text = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    listed = set(re.findall(r"^\| `(gpulaunch_\w+)", text, re.MULTILINE))
    assert served == listed


def test_a_job_without_steps_has_no_step_families() -> None:
    job = progress()
    plain = JobProgress(job.spec, job.phase, tuple(r for r in job.ranks if r.steps is None), 0, 100)
    text = openmetrics(families(plain, {}, "n1", 0.0))
    assert "gpulaunch_rank_step" not in text and "straggler" not in text
    assert text.endswith("# EOF\n")
    om_parse(text)  # valid on its own


@pytest.mark.parametrize(
    ("text", "listen"),
    [
        ("9400", Listen("127.0.0.1", 9400)),  # loopback unless an address is given
        (":9400", Listen("127.0.0.1", 9400)),
        ("0.0.0.0:9400", Listen("0.0.0.0", 9400)),
        ("[::]:9400", Listen("::", 9400)),
        ("127.0.0.1:0", Listen("127.0.0.1", 0)),
        ("[::1]:80", Listen("::1", 80)),
        ("node7:65535", Listen("node7", 65535)),
    ],
)
def test_listen_addresses(text: str, listen: Listen) -> None:
    assert parse_listen(text) == listen


@pytest.mark.parametrize(
    "text", ["", "x", "1.2.3.4:", ":65536", "::1:80", "a:-1", "[a]:1", ":\u0663"]
)
def test_bad_listen_addresses_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_listen(text)


@pytest.mark.parametrize(
    "text", ["\udcff:0", "h" * 300 + ":0", "a..b:0", "-a:0", "a b:0", ("x" * 64) + ".org:1"]
)
def test_a_host_the_resolver_would_choke_on_is_refused(text: str) -> None:
    """Issue 35: `$'\\xff':0` (argv's undecodable byte) and a 300-character host were exit 70
    from the resolver's codec; now one line from argparse (exit 2)."""
    with pytest.raises(argparse.ArgumentTypeError, match="not a host name or IP address"):
        parse_listen(text)


def test_port_alone_listens_on_loopback_only() -> None:
    """Issue 35: `--metrics-listen PORT` bound every address; an address is a choice now."""
    sock = bind(parse_listen("0"))
    with sock:
        assert sock.family == socket.AF_INET and sock.getsockname()[0] == "127.0.0.1"


def test_the_options_as_parsed() -> None:
    p = argparse.ArgumentParser()
    add_metrics_options(p)
    assert metrics_options(p.parse_args([])) == MetricsOptions()
    got = metrics_options(p.parse_args(["--metrics-textfile", "/d", "--metrics-interval", "2"]))
    assert got == MetricsOptions(textfile=Path("/d"), interval=2.0)
    with pytest.raises(UsageError, match="--metrics-interval is how often --metrics-textfile"):
        metrics_options(p.parse_args(["--metrics-listen", "1", "--metrics-interval", "2"]))


def test_nothing_is_made_when_no_metrics_option_is_given() -> None:
    assert metrics_observers(None, print) == ()
    assert metrics_observers(MetricsOptions(), print) == ()


# -- the endpoint ---------------------------------------------------------------


async def _request(port: int, *requests: bytes) -> list[bytes]:
    """Send requests on one connection; each answer's head and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers = []
    try:
        for request in requests:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            body = b"" if request.startswith(b"HEAD") else await reader.readexactly(length)
            answers.append(head + body)
    finally:
        writer.close()
    return answers


def test_the_endpoint_serves_openmetrics_or_text_on_one_kept_connection() -> None:
    found = families(progress(), USES, "n1", 100.0)

    def render(om: bool) -> tuple[bytes, str]:
        return (openmetrics(found) if om else prometheus_text(found)).encode(), "t/" + str(om)

    async def main() -> list[bytes]:
        server = MetricsServer(bind(Listen("127.0.0.1", 0)), render)
        await server.start()
        port = server.sock.getsockname()[1]
        try:
            return await _request(
                port,
                b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=1.0.0"
                b"\r\n\r\n",
                b"GET /metrics HTTP/1.1\r\n\r\n",
                b"HEAD / HTTP/1.1\r\n\r\n",
                b"GET /other HTTP/1.1\r\n\r\n",
                b"POST /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
            )
        finally:
            server.close()

    om, text, head, missing, post = asyncio.run(main())
    assert om.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Type: t/True" in om
    om_parse(om.split(b"\r\n\r\n", 1)[1].decode())
    assert b"Content-Type: t/False" in text
    assert samples(text.split(b"\r\n\r\n", 1)[1].decode(), open_metrics=False)
    assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
    assert missing.startswith(b"HTTP/1.1 404")
    assert post.startswith(b"HTTP/1.1 405") and b"Connection: close" in post


def test_a_hostile_client_is_dropped_and_others_still_served() -> None:
    """A head over 16 KiB, HTTP/1.0 (closes after one answer), garbage, too many clients."""

    def render(om: bool) -> tuple[bytes, str]:
        return b"a 1\n", "text/plain"

    async def main() -> None:
        server = MetricsServer(bind(Listen("127.0.0.1", 0)), render)
        await server.start()
        port = server.sock.getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /metrics HTTP/1.1\r\nX: " + b"x" * (MAX_HEAD + 10))
            assert await asyncio.wait_for(reader.read(), 5) == b""  # dropped, no answer
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 5)  # then closed by us
            assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"a 1\n")
            writer.close()
            (bad,) = await _request(port, b"HELLO\r\n\r\n")
            assert bad.startswith(b"HTTP/1.1 400")
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_CLIENTS)]
            (ok,) = await _request(port, b"GET /metrics HTTP/1.1\r\n\r\n")  # one more: served
            assert ok.startswith(b"HTTP/1.1 200 OK")
            # the one that waited longest without asking made room for it
            assert await asyncio.wait_for(held[0][0].read(), 5) == b""
            for _, w in held:
                w.close()
        finally:
            await server.aclose()

    asyncio.run(main())


def test_scrapes_are_served_while_40_idle_connections_are_open() -> None:
    """Issue 35: 16 clients at most, each allowed to idle 30 s, so 40 idle connections made 24
    of 25 scrapes fail. A newcomer now drops the connection that waited longest without
    asking: every scrape is answered, however many connections idle."""

    def render(om: bool) -> tuple[bytes, str]:
        return b"a 1\n", "text/plain"

    async def main() -> list[bytes]:
        server = MetricsServer(bind(parse_listen("0")), render)
        await server.start()
        port = server.sock.getsockname()[1]
        idle = []
        try:
            for _ in range(40):
                idle.append(await asyncio.open_connection("127.0.0.1", port))
                await asyncio.sleep(0)
            answers = []
            for _ in range(25):
                answers += await asyncio.wait_for(
                    _request(port, b"GET /metrics HTTP/1.1\r\n\r\n"), 10
                )
                idle.append(await asyncio.open_connection("127.0.0.1", port))  # and more idle
            return answers
        finally:
            for _, w in idle:
                w.close()
            await server.aclose()

    answers = asyncio.run(main())
    assert len(answers) == 25 and all(a.startswith(b"HTTP/1.1 200 OK") for a in answers)


def test_a_connection_that_never_asks_is_dropped_after_the_head_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new connection must send its request within HEAD_TIMEOUT (5 s; shortened here)."""
    from gpulaunch.metrics import server as module

    monkeypatch.setattr(module, "HEAD_TIMEOUT", 0.2)

    async def main() -> bytes:
        server = MetricsServer(bind(Listen("127.0.0.1", 0)), lambda om: (b"a 1\n", "t"))
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", server.sock.getsockname()[1]
            )
            writer.write(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
            try:
                return await asyncio.wait_for(reader.read(), 10)
            finally:
                writer.close()
        finally:
            await server.aclose()

    assert asyncio.run(main()) == b""  # closed without an answer, well before 10 s


def test_a_port_in_use_is_one_line() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(UnavailableError) as err:
            bind(Listen("127.0.0.1", port))
    assert f"cannot serve metrics on 127.0.0.1:{port}" in err.value.args[0]


def test_every_address_includes_loopback() -> None:
    sock = bind(Listen("::", 0))
    with sock, socket.create_connection(("127.0.0.1", sock.getsockname()[1]), timeout=5):
        assert bound_address(sock).endswith(f":{sock.getsockname()[1]}")


def test_an_address_not_of_this_machine_is_one_line() -> None:
    with pytest.raises(UnavailableError) as err:
        bind(Listen("192.0.2.1", 0))  # TEST-NET-1: never this machine's
    assert err.value.args[0] == (
        "cannot serve metrics on 192.0.2.1:0: Cannot assign requested address"
    )
    with pytest.raises(UnavailableError) as err:
        bind(Listen("no-such-host.invalid", 0))
    assert err.value.args[0].startswith("cannot serve metrics on no-such-host.invalid:0: ")


def test_port_0_says_the_port_it_got() -> None:
    sock = bind(Listen("127.0.0.1", 0))
    with sock:
        assert bound_address(sock) == f"127.0.0.1:{sock.getsockname()[1]}"
        assert sock.getsockname()[1] > 0


def test_the_observer_serves_the_newest_progress_and_closes() -> None:
    said: list[str] = []
    observer = MetricsObserver(
        MetricsOptions(listen=Listen("127.0.0.1", 0)), said.append, node="n1", gpus="none"
    )
    loop = asyncio.new_event_loop()
    try:
        first = progress()
        observer.attach(first, Controls(lambda: None), loop)
        assert observer.server is not None
        port = observer.server.sock.getsockname()[1]
        assert said == [f"gpulaunch: job {JOB}: metrics at http://127.0.0.1:{port}/metrics"]
        observer.changed(
            JobProgress(first.spec, Phase.STOPPING, first.ranks, 3, first.watcher_pid), None
        )
        (answer,) = loop.run_until_complete(_request(port, b"GET /metrics HTTP/1.1\r\n\r\n"))
        got = samples(answer.split(b"\r\n\r\n", 1)[1].decode(), open_metrics=False)
        assert got[("gpulaunch_job_restarts_total", labels())] == 3
        assert got[("gpulaunch_job_phase", labels(gpulaunch_job_phase="stopping"))] == 1
        observer.close()
        with pytest.raises(OSError):
            loop.run_until_complete(_request(port, b"GET /metrics HTTP/1.1\r\n\r\n"))
    finally:
        loop.close()


def test_the_end_leaves_no_connection_pending() -> None:
    """A scraper keeping its connection open when the job ends: its task ends with it, so
    the watcher closes its loop with nothing pending (asyncio would say so on stderr)."""
    observer = MetricsObserver(
        MetricsOptions(listen=Listen("127.0.0.1", 0)), lambda _: None, node="n1", gpus="none"
    )
    loop = asyncio.new_event_loop()
    try:
        job = progress()
        observer.attach(job, Controls(lambda: None), loop)
        assert observer.server is not None
        port = observer.server.sock.getsockname()[1]

        async def idle_client() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nAccept: application/openmetrics-text\r\n\r\n")
            await reader.readuntil(b"# EOF\n")  # answered; the connection stays open
            return reader, writer

        reader, writer = loop.run_until_complete(idle_client())
        report = JobReport(JOB, 0, Cause.SUCCEEDED, None, None)
        loop.run_until_complete(asyncio.wait_for(observer.finished(job, report), 2))
        assert [t for t in asyncio.all_tasks(loop) if not t.done()] == []
        assert loop.run_until_complete(reader.read()) == b""  # dropped by us
        writer.close()
    finally:
        loop.close()


# -- the textfile ---------------------------------------------------------------


def test_the_textfile_is_replaced_whole_and_removed_at_the_end(tmp_path: Path) -> None:
    said: list[str] = []
    observer = MetricsObserver(
        MetricsOptions(textfile=tmp_path, interval=3600), said.append, node="n1", gpus="none"
    )
    loop = asyncio.new_event_loop()
    try:
        observer.attach(progress(), Controls(lambda: None), loop)
        (written,) = list(tmp_path.iterdir())
        assert written.name == f"gpulaunch-{UnitNames.for_job(JOB).component}.prom"
        assert said == [f"gpulaunch: job {JOB}: metrics at {written}"]
        got = samples(written.read_text(), open_metrics=False)
        assert got[("gpulaunch_rank_step", labels(10))] == 40
        observer.close()
        assert list(tmp_path.iterdir()) == []
    finally:
        loop.close()


def test_the_textfile_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    f = TextFile(out, "job")
    (out / "gpulaunch-job.prom").symlink_to(target)
    (out / ".gpulaunch-job.prom.tmp").symlink_to(target)
    assert f.write("a 1\n") is None
    assert target.read_text() == "keep"
    assert (out / "gpulaunch-job.prom").read_text() == "a 1\n"
    assert not (out / "gpulaunch-job.prom").is_symlink()
    f.remove()


def test_a_textfile_directory_that_is_not_one_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        TextFile(tmp_path / "missing", "job")
    assert "--metrics-textfile" in err.value.args[0] and "No such file" in err.value.args[0]


def test_a_failed_write_is_said_once(tmp_path: Path) -> None:
    f = TextFile(tmp_path, "job")
    (tmp_path / "gpulaunch-job.prom").mkdir()  # rename(2) over a directory fails
    first = f.write("a 1\n")
    assert first is not None and "could not write" in first
    assert f.write("a 1\n") is None  # the same failure: not said again
    (tmp_path / "gpulaunch-job.prom").rmdir()
    assert f.write("a 1\n") is None and f.problem is None
    f.remove()


# -- what ranks use ---------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A fake /proc and cgroup tree: rank pid 11 (and its pump 12) in their own unit,
    the watcher (pid 1) and a direct-supervised rank (pid 21) in a shared cgroup."""
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    unit = root / "job.slice" / "rank0.scope"
    shared = root / "session.scope"
    for group, pids in ((unit, [11, 12]), (shared, [1, 21])):
        group.mkdir(parents=True)
        (group / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
        (group / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 1\n")
        for p in pids:
            (proc / str(p)).mkdir(parents=True)
            (proc / str(p) / "cgroup").write_text(f"0::/{group.relative_to(root)}\n")
            (proc / str(p) / "statm").write_text(f"100 {p} 3 1 0 5 0\n")
    (unit / "memory.current").write_text("7340032\n")
    yield proc, root


def test_usage_comes_from_the_rank_s_cgroup(tree: tuple[Path, Path]) -> None:
    proc, root = tree
    reader = UsageReader(proc=proc, root=root)
    ranks = (
        RankProgress(0, 0, "rank0.scope", RankState.RUNNING, 11, False, None),
        RankProgress(1, 1, "", RankState.RUNNING, 21, False, None),
        RankProgress(2, 2, "", RankState.PENDING, None, False, None),
    )
    uses = reader.read(ranks, watcher_pid=1)
    page = os.sysconf("SC_PAGE_SIZE")
    assert uses[0] == RankUse(cpu_seconds=2.5, memory=7340032, rss=(11 + 12) * page, processes=2)
    assert uses[1] == RankUse()  # the watcher's cgroup: not this rank's alone
    assert 2 not in uses


@pytest.mark.parametrize("value", [b"\xff:0", b"h" * 300 + b":0"])
def test_a_bad_metrics_host_on_the_command_line_is_one_line_and_exit_2(
    value: bytes, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    res = subprocess.run(
        [sys.executable, "-m", "gpulaunch", "start", "--metrics-listen", value, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "--metrics-listen" in line and "not a host name or IP address" in line, res.stderr
    assert "Traceback" not in res.stderr and os.listdir(tmp_path) == ["train.py"]


# -- docs/grafana/gpulaunch.json (issue 39 item 4) --------------------------------------

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "gpulaunch.json"
SERIES = re.compile(r"\b(gpulaunch_[a-z_]+)\b")


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


def queried(dashboard: dict[str, Any]) -> set[str]:
    """The series named in the panels' queries and the variables' queries."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    exprs += list(_strings(dashboard["templating"]))
    return {n for e in exprs for n in SERIES.findall(e)}


def served_series(open_metrics: bool) -> set[str]:
    """Every series a job serves where everything is known: ranks that step, one a
    straggler, GPUs, restarts, goodput."""
    job = progress()
    ranks = [replace(r, gpu=i) for i, r in enumerate(job.spec.ranks)]  # GPU labels too
    job = replace(job, spec=replace(job.spec, ranks=tuple(ranks)))
    found = families(job, USES, "n1", 100.0, GOODPUT)
    text = openmetrics(found) if open_metrics else prometheus_text(found)
    parse = om_parse if open_metrics else text_parse
    return {s.name for family in parse(text) for s in family.samples}


@pytest.mark.parametrize("open_metrics", [True, False], ids=["openmetrics", "text-0.0.4"])
def test_every_series_the_dashboard_queries_is_served(open_metrics: bool) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    names = queried(dashboard)
    assert names, "the dashboard queries no gpulaunch series"
    assert names - served_series(open_metrics) == set()


def test_the_dashboard_has_the_panels_docs_promise_and_is_linked() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = {
        p["title"]: " ".join(t["expr"] for t in p.get("targets", ()))
        for p in dashboard["panels"]
        if p["type"] != "row"
    }
    wanted = {
        "goodput": "gpulaunch_job_goodput_ratio",
        "steps/s per rank": "gpulaunch_rank_steps_per_second",
        "stragglers": "gpulaunch_rank_straggler",
        "restarts": "gpulaunch_job_restarts_total",
        "gpu utilisation": "gpulaunch_rank_gpu_utilization_ratio",
        "gpu memory": "gpulaunch_rank_gpu_memory_bytes",
    }
    for word, series in wanted.items():
        panels = [t for t, e in exprs.items() if word in t.lower() and series in e]
        assert panels, (word, series, sorted(exprs))
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert "](grafana/gpulaunch.json)" in (DASHBOARD.parents[1] / "metrics.md").read_text()
