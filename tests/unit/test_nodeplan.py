"""Multi-node options: torchrun's rules, SLURM's environment, and what they make of the ranks.

SLURM is not installed here: every SLURM environment below is a synthetic dict
written to look like what srun or sbatch export (srun(1), sbatch(1), "OUTPUT
ENVIRONMENT VARIABLES"). The rank environment of a multi-node job is checked
against what torchrun's agent sets (torch/distributed/elastic/agent/server/
local_elastic_agent.py `_start_workers`, api.py `_assign_worker_ranks`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpulaunch import cli
from gpulaunch.base.protocol import Backend, Layout, NodeConfig, NodeInfo
from gpulaunch.errors import UsageError
from gpulaunch.model import JobSpec
from gpulaunch.plan.nodes import (
    C10D_PORT,
    LOCALHOST,
    STATIC_PORT,
    NodeOptions,
    NodePlan,
    parse_nnodes,
    plan_nodes,
    split_endpoint,
)
from gpulaunch.plan.placement import Machine
from gpulaunch.plan.spec import StartOptions, draft_job, make_spec, number_ranks
from tests.unit.fakes import Untouchable, placement_options

# What `srun --nodes=2 --ntasks-per-node=1` exports on the second node of a
# two-node allocation (job 4242, step 0).
SRUN_STEP = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOBID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_NTASKS": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_JOB_NODELIST": "gpu[11-12]",
    "SLURM_NODELIST": "gpu[11-12]",
    "SLURM_STEP_NODELIST": "gpu[11-12]",
    "SLURMD_NODENAME": "gpu12",
}
SLURM_MASTER = "gpu11"  # the first host of gpu[11-12]
SLURM_PORT = 20000 + 4242  # slurm_master_port("4242")
SLURM_JOB = "train_slurm4242.0"  # slurm_job_name("4242", "0", "train")

# What sbatch exports to the batch script of a two-node allocation: no step id,
# the batch script runs once, on the first node.
BATCH_2_NODES = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOBID": "4242",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS": "2",
    "SLURM_NODEID": "0",
    "SLURM_JOB_NODELIST": "gpu[11-12]",
    "SLURM_NODELIST": "gpu[11-12]",
}

# The batch script of a one-node allocation.
BATCH_1_NODE = {
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_NNODES": "1",
    "SLURM_NODEID": "0",
    "SLURM_JOB_NODELIST": "gpu03",
}


def plan(
    env: Mapping[str, str] | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    max_restarts: int = 0,
    **options: object,
) -> NodePlan:
    return plan_nodes(
        NodeOptions(**options),  # type: ignore[arg-type]
        master_addr,
        master_port,
        max_restarts,
        "train",
        env or {},
    )


def digest_job(endpoint: str, stem: str = "train") -> str:
    """The default id of a multi-node job: every node derives it alike from the endpoint."""
    return f"{stem}_{hashlib.sha256(endpoint.encode()).hexdigest()[:6]}"


def usage_error(**kw: object) -> UsageError:
    """plan(**kw) fails as a usage error: one line (plus an optional one-line hint), exit 2."""
    with pytest.raises(UsageError) as info:
        plan(**kw)  # type: ignore[arg-type]
    err = info.value
    assert err.exit_code == 2
    assert err.message and "\n" not in err.message
    assert "\n" not in (err.hint or "")
    return err


# -- --nnodes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "nnodes"),
    [
        ("1", (1, 1)),
        ("2", (2, 2)),
        ("16", (16, 16)),
        ("4:4", (4, 4)),
        ("1:1", (1, 1)),
        (" 3 ", (3, 3)),
        ("2:4", (2, 4)),
        ("1:4", (1, 4)),
    ],
)
def test_parse_nnodes(text: str, nnodes: tuple[int, int]) -> None:
    assert parse_nnodes(text) == nnodes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("4:2", "--nnodes 4:2: the minimum is more than the maximum"),
        ("2:0", "--nnodes must be between 1 and 65536, not 0"),
        ("0", "--nnodes must be between 1 and 65536, not 0"),
        ("0:0", "--nnodes must be between 1 and 65536, not 0"),
        ("-2", "--nnodes must be between 1 and 65536, not -2"),
        ("abc", "--nnodes must be a number of nodes, not 'abc'"),
        ("", "--nnodes must be a number of nodes, not ''"),
        ("2:x", "--nnodes must be a number of nodes, not '2:x'"),
        ("1:2:3", "--nnodes must be a number of nodes, not '1:2:3'"),
        ("two", "--nnodes must be a number of nodes, not 'two'"),
    ],
)
def test_parse_nnodes_refuses(text: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_nnodes(text)
    assert info.value.message == message
    assert info.value.exit_code == 2


def test_elastic_ranges_need_c10d() -> None:
    err = usage_error(nnodes="2:4")
    assert err.message.startswith(
        "--nnodes 2:4: a range of nodes needs the c10d or gpulaunch rendezvous"
    )
    assert err.hint == "add --rdzv-backend c10d --rdzv-endpoint HOST:PORT, or give one number"


def test_elastic_range_with_c10d_sets_the_minimum() -> None:
    p = plan(nnodes="2:4", rdzv_backend="c10d", rdzv_endpoint="rdv", max_restarts=3)
    assert p.config is not None
    assert (p.config.min_nodes, p.config.nnodes, p.config.wanted) == (2, 4, "2 to 4")
    fixed = plan(nnodes="3:3", rdzv_backend="c10d", rdzv_endpoint="rdv")
    assert fixed.config is not None and (fixed.config.min_nodes, fixed.config.wanted) == (None, "3")


@pytest.mark.parametrize("backend", [None, "c10d"])
def test_max_restarts_with_several_nodes(backend: str | None) -> None:
    kw = {"rdzv_backend": backend, "rdzv_endpoint": "rdv"} if backend else {}
    p = plan(nnodes="2", max_restarts=3, **kw)  # type: ignore[arg-type]
    assert p.config is not None and p.config.nnodes == 2


# -- endpoints ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("node0", ("node0", 29400)),
        ("node0:1234", ("node0", 1234)),
        ("node0.example.com:65535", ("node0.example.com", 65535)),
        ("10.0.0.1:1", ("10.0.0.1", 1)),
        # IPv6: in brackets, with or without a port
        ("[::1]:29401", ("::1", 29401)),
        ("[::1]", ("::1", 29400)),
        ("localhost:0", ("localhost", 0)),  # torchrun's "a free port"
        ("[::1]:0", ("::1", 0)),
    ],
)
def test_split_endpoint(text: str, expected: tuple[str, int]) -> None:
    assert split_endpoint(text, 29400, "--rdzv-endpoint") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        ":29400",
        "node0:http",
        "node0:65536",
        "node0:-1",
        # IPv6
        "[]:29400",
        "[]",
        "[::1]:http",
        "[::1]:70000",
        "[::1]x",
    ],
)
def test_split_endpoint_refuses(text: str) -> None:
    with pytest.raises(UsageError) as info:
        split_endpoint(text, 29400, "--rdzv-endpoint")
    err = info.value
    assert err.message == f"--rdzv-endpoint {text!r} is not HOST[:PORT]"
    assert err.exit_code == 2 and err.hint is not None
    assert err.hint.startswith("e.g. node0.example:29400")


@pytest.mark.parametrize(
    "text",
    ["[::1", "[::1]29400", "node0 :29400", "node0:1_0", "node0:+1", "[fe80::1%eth0]:5"],
)
def test_split_endpoint_refuses_what_torch_refuses(text: str) -> None:
    with pytest.raises(UsageError):
        split_endpoint(text, 29400, "--rdzv-endpoint")


@pytest.mark.parametrize("text", ["fe80::1:29400", "::1", "2001:db8::7"])
def test_bare_ipv6_needs_brackets(text: str) -> None:
    """torch would read the last group as a port (`::1` -> host `:`, port 1): ambiguous."""
    with pytest.raises(UsageError) as info:
        split_endpoint(text, 29400, "--rdzv-endpoint")
    assert "needs brackets" in info.value.message and info.value.hint == "e.g. [fd00::1]:29400"


# -- one node ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"nnodes": "1"},
        {"nnodes": "1:1"},
        {"nnodes": "1", "node_rank": 0},
        {"node_rank": 0},
        {"rdzv_backend": "static"},
        {"rdzv_conf": "timeout=5"},  # ignored, as torchrun ignores it without a rendezvous
        {"local_addr": "node0"},
    ],
)
def test_one_node_has_no_node_config(options: dict[str, object]) -> None:
    p = plan(**options)  # type: ignore[arg-type]
    assert p == NodePlan(config=None, default_job=None, master_addr=LOCALHOST, master_port=None)
    assert p.for_job("j", 4) is None


@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_port_0_is_torchruns_single_node_idiom(backend: str) -> None:
    """torchrun --rdzv-backend c10d --rdzv-endpoint localhost:0: one node, a free port."""
    for options in ({}, {"nnodes": "1"}):
        p = plan(rdzv_backend=backend, rdzv_endpoint="localhost:0", **options)  # type: ignore[arg-type]
        assert p == NodePlan(config=None, default_job=None, master_addr=LOCALHOST, master_port=None)


def test_port_0_on_several_nodes_is_refused() -> None:
    with pytest.raises(UsageError) as info:
        plan(nnodes="2", rdzv_backend="c10d", rdzv_endpoint="localhost:0")
    assert "port 0" in info.value.message and info.value.exit_code == 2


def test_one_node_keeps_master_addr_and_port() -> None:
    p = plan(master_addr="10.1.2.3", master_port=1234)
    assert (p.config, p.master_addr, p.master_port) == (None, "10.1.2.3", 1234)


def test_one_node_takes_rdzv_id_as_the_default_job() -> None:
    assert plan(rdzv_id="exp1").default_job == "exp1"


def test_one_node_allows_max_restarts() -> None:
    assert plan(max_restarts=3).config is None


# -- static rendezvous -------------------------------------------------------------


def test_static_defaults_as_torchrun() -> None:
    """--nnodes 2 alone: node 0, endpoint 127.0.0.1:29500 (torchrun's --master-addr/-port)."""
    p = plan(nnodes="2")
    assert p.config == NodeConfig(
        backend=Backend.STATIC,
        endpoint=f"127.0.0.1:{STATIC_PORT}",
        run_id="",
        nnodes=2,
        nproc=0,
        job="",
        node_rank=0,
    )
    assert p.default_job == digest_job("127.0.0.1:29500") + "-node0"


def test_static_from_master_addr_and_port() -> None:
    p = plan(nnodes="4", node_rank=3, master_addr="node0", master_port=1234, local_addr="node3")
    assert p.config is not None
    assert (p.config.endpoint, p.config.node_rank, p.config.nnodes) == ("node0:1234", 3, 4)
    assert p.config.local_addr == "node3"
    assert p.default_job == digest_job("node0:1234") + "-node3"


def test_static_rdzv_endpoint_wins_over_master_addr() -> None:
    """torchrun uses --master-addr:--master-port only when no --rdzv-endpoint is given."""
    p = plan(nnodes="2", rdzv_endpoint="rdv:4000", master_addr="node0", master_port=1234)
    assert p.config is not None and p.config.endpoint == "rdv:4000"
    p = plan(nnodes="2", rdzv_backend="static", rdzv_endpoint="rdv")
    assert p.config is not None and p.config.endpoint == f"rdv:{STATIC_PORT}"


def test_static_endpoint_on_one_node_is_a_rendezvous() -> None:
    p = plan(nnodes="1", rdzv_endpoint="rdv:4000")
    assert p.config is not None
    assert (p.config.backend, p.config.nnodes, p.config.node_rank) == (Backend.STATIC, 1, 0)


def test_ipv6_endpoints_are_bracketed() -> None:
    p = plan(nnodes="2", master_addr="fd00::1")
    assert p.config is not None and p.config.endpoint == "[fd00::1]:29500"
    p = plan(nnodes="2", rdzv_backend="c10d", rdzv_endpoint="[fd00::2]:4000")
    assert p.config is not None and p.config.endpoint == "[fd00::2]:4000"
    assert p.run_id == digest_job("[fd00::2]:4000")


@pytest.mark.parametrize(
    ("conf", "pairs"),
    [
        ("timeout=900", (("timeout", "900"),)),
        (
            "join_timeout=5, last_call_timeout = 2",
            (("join_timeout", "5"), ("last_call_timeout", "2")),
        ),
        ("a=b=c", (("a", "b=c"),)),
        ("", ()),
    ],
)
def test_rdzv_conf_pairs(conf: str, pairs: tuple[tuple[str, str], ...]) -> None:
    p = plan(nnodes="2", rdzv_conf=conf)
    assert p.config is not None and p.config.rdzv_conf == pairs


def test_rdzv_conf_needs_a_value() -> None:
    usage_error(nnodes="2", rdzv_conf="join_timeout=")


# -- c10d rendezvous ---------------------------------------------------------------


def test_c10d_as_torchrun() -> None:
    p = plan(nnodes="3", rdzv_backend="c10d", rdzv_endpoint="rdv", local_addr="me")
    assert p.config == NodeConfig(
        backend=Backend.C10D,
        endpoint=f"rdv:{C10D_PORT}",
        run_id="",
        nnodes=3,
        nproc=0,
        job="",
        node_rank=None,  # the rendezvous assigns it
        local_addr="me",
    )
    assert p.run_id == digest_job("rdv:29400")
    # c10d numbers the nodes later: the default id is this launcher's
    assert re.fullmatch(digest_job("rdv:29400") + "-[0-9a-f]{6}", p.default_job or "")


def test_c10d_on_one_node_is_a_rendezvous() -> None:
    p = plan(nnodes="1", rdzv_backend="c10d", rdzv_endpoint="rdv:4000")
    assert p.config is not None and (p.config.backend, p.config.nnodes) == (Backend.C10D, 1)


# -- the job id and the run id ---------------------------------------------------------


def test_default_job_differs_per_node_and_the_run_id_is_shared() -> None:
    """Issue 35 item 6: two nodes of one job on one machine (`--nnodes 2` on localhost) must
    not collide: each node's default id is its own; the run id (the rendezvous's) is one."""
    plans = [plan(nnodes="3", node_rank=r, master_addr="node0") for r in range(3)]
    assert [p.default_job for p in plans] == [
        digest_job("node0:29500") + f"-node{r}" for r in range(3)
    ]
    assert {p.run_id for p in plans} == {digest_job("node0:29500")}
    assert re.fullmatch(r"train_[0-9a-f]{6}", plans[0].run_id or "")
    configs = [p.for_job(p.default_job or "", 2) for p in plans]
    assert {c.run_id for c in configs if c is not None} == {digest_job("node0:29500")}


def test_c10d_default_job_differs_per_launcher() -> None:
    """c10d assigns node ranks in the rendezvous: two launchers' default ids still differ."""
    opts = {"nnodes": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "localhost:29400"}
    a, b = plan(**opts), plan(**opts)  # type: ignore[arg-type]
    assert a.default_job != b.default_job
    assert a.run_id == b.run_id == digest_job("localhost:29400")


def test_default_job_differs_by_endpoint() -> None:
    a = plan(nnodes="2", master_addr="node0").default_job
    b = plan(nnodes="2", master_addr="node1").default_job
    c = plan(nnodes="2", master_addr="node0", master_port=29501).default_job
    assert len({a, b, c}) == 3


def test_rdzv_id_is_the_run_id_and_names_the_default_job() -> None:
    p = plan(nnodes="2", rdzv_id="exp1")
    assert p.default_job == "exp1-node0"
    config = p.for_job("exp1-node0", 4)
    assert config is not None and config.run_id == "exp1"
    assert p.config is not None and p.config.run_id == "exp1"
    assert p.for_job("other", 4) == NodeConfig(
        backend=Backend.STATIC,
        endpoint="127.0.0.1:29500",
        run_id="exp1",
        nnodes=2,
        nproc=4,
        job="other",
        node_rank=0,
    )


def test_without_rdzv_id_the_run_id_is_the_job() -> None:
    p = plan(nnodes="2")
    config = p.for_job("mine", 8)
    assert config is not None
    assert (config.run_id, config.job, config.nproc) == ("mine", "mine", 8)


# -- usage errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"nnodes": "1:4"},
            "--nnodes 1:4: a range of nodes needs the c10d or gpulaunch rendezvous "
            "(the static one numbers a fixed set of nodes)",
        ),
        ({"nnodes": "0"}, "--nnodes must be between 1 and 65536, not 0"),
        ({"nnodes": "abc"}, "--nnodes must be a number of nodes, not 'abc'"),
        (
            {"nnodes": "2", "rdzv_backend": "etcd", "rdzv_endpoint": "rdv:2379"},
            "--rdzv-backend etcd is not supported",
        ),
        ({"rdzv_backend": "etcd-v2"}, "--rdzv-backend etcd-v2 is not supported"),
        (
            {"nnodes": "2", "rdzv_backend": "C10D", "rdzv_endpoint": "rdv"},
            "--rdzv-backend C10D is not supported",
        ),
        (
            {"nnodes": "2", "rdzv_backend": "c10d"},
            "--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT]",
        ),
        (
            {"rdzv_backend": "c10d"},
            "--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT]",
        ),
        ({"nnodes": "2", "node_rank": 2}, "node rank 2 is not a node of a 2-node job"),
        ({"nnodes": "3", "node_rank": 7}, "node rank 7 is not a node of a 3-node job"),
        ({"nnodes": "2", "node_rank": -1}, "node rank -1 is not a node of a 2-node job"),
        ({"node_rank": 1}, "--node-rank 1 needs --nnodes greater than 1"),
        ({"nnodes": "1", "node_rank": 3}, "--node-rank 3 needs --nnodes greater than 1"),
        (
            {"nnodes": "2", "rdzv_conf": "timeout"},
            "--rdzv-conf 'timeout': 'timeout' is not KEY=VALUE",
        ),
        ({"nnodes": "2", "rdzv_conf": "=5"}, "--rdzv-conf '=5': '=5' is not KEY=VALUE"),
        (
            {"nnodes": "2", "rdzv_conf": "a=1,,b=2"},
            "--rdzv-conf 'a=1,,b=2': '' is not KEY=VALUE",
        ),
        (
            {"nnodes": "2", "rdzv_endpoint": "rdv:http"},
            "--rdzv-endpoint 'rdv:http' is not HOST[:PORT]",
        ),
        (
            {"nnodes": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "rdv:0"},
            "--rdzv-endpoint rdv:0: port 0 (a free port) works only for one node, "
            "and this job has 2",
        ),
        (
            {"nnodes": "2", "rdzv_backend": "c10d", "rdzv_endpoint": ""},
            "--rdzv-endpoint '' is not HOST[:PORT]",
        ),
        (
            {"nnodes": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "[::1]:99999"},
            "--rdzv-endpoint '[::1]:99999' is not HOST[:PORT]",
        ),
        (
            {"nnodes": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "[]:29400"},
            "--rdzv-endpoint '[]:29400' is not HOST[:PORT]",
        ),
        (
            {"env": BATCH_2_NODES},
            "gpulaunch runs in the batch script of a 2-node SLURM allocation, not in an srun "
            "step, so the other nodes would never join",
        ),
        (
            {"env": {**SRUN_STEP, "SLURM_NODEID": ""}},
            "SLURM_NODEID is not set in a SLURM step of 2 nodes",
        ),
    ],
    ids=lambda v: None if isinstance(v, str) else repr(v)[:60],
)
def test_usage_errors(kw: dict[str, object], message: str) -> None:
    assert usage_error(**kw).message == message


@pytest.mark.parametrize(
    ("kw", "hint"),
    [
        (
            {"nnodes": "2", "rdzv_backend": "etcd"},
            "use static (--node-rank, --master-addr), c10d or gpulaunch",
        ),
        ({"nnodes": "2", "rdzv_backend": "c10d"}, "the same on every node"),
        ({"nnodes": "2", "node_rank": 5}, "give --node-rank 0 to 1"),
        ({"env": BATCH_2_NODES}, "srun --ntasks-per-node=1 gpulaunch start"),
    ],
)
def test_usage_error_hints(kw: dict[str, object], hint: str) -> None:
    assert hint in (usage_error(**kw).hint or "")


# -- SLURM (synthetic environments) ----------------------------------------------------


def test_slurm_step_gives_a_static_config() -> None:
    """An srun step of two nodes: node rank, node count and first host from SLURM."""
    p = plan(env=SRUN_STEP)
    assert p.config == NodeConfig(
        backend=Backend.STATIC,
        endpoint=f"{SLURM_MASTER}:{SLURM_PORT}",
        run_id="",
        nnodes=2,
        nproc=0,
        job="",
        node_rank=1,
    )
    assert p.default_job == SLURM_JOB


def test_every_node_of_a_slurm_step_agrees() -> None:
    first = plan(env={**SRUN_STEP, "SLURM_NODEID": "0", "SLURMD_NODENAME": "gpu11"})
    second = plan(env=SRUN_STEP)
    assert first.config is not None and second.config is not None
    assert first.config.endpoint == second.config.endpoint
    assert first.default_job == second.default_job == SLURM_JOB
    assert (first.config.node_rank, second.config.node_rank) == (0, 1)


@pytest.mark.parametrize(
    ("kw", "endpoint", "nnodes", "node_rank", "job"),
    [
        ({"master_addr": "head"}, f"head:{SLURM_PORT}", 2, 1, SLURM_JOB),
        ({"master_port": 1234}, f"{SLURM_MASTER}:1234", 2, 1, SLURM_JOB),
        ({"master_addr": "head", "master_port": 1234}, "head:1234", 2, 1, SLURM_JOB),
        ({"node_rank": 0}, f"{SLURM_MASTER}:{SLURM_PORT}", 2, 0, SLURM_JOB),
        ({"nnodes": "4"}, f"{SLURM_MASTER}:{SLURM_PORT}", 4, 1, SLURM_JOB),
        ({"nnodes": "4", "node_rank": 3}, f"{SLURM_MASTER}:{SLURM_PORT}", 4, 3, SLURM_JOB),
        ({"rdzv_endpoint": "rdv:4000"}, "rdv:4000", 2, 1, SLURM_JOB),
        ({"rdzv_id": "exp1"}, f"{SLURM_MASTER}:{SLURM_PORT}", 2, 1, "exp1"),
        (
            {"rdzv_backend": "c10d", "rdzv_endpoint": "rdv"},
            f"rdv:{C10D_PORT}",
            2,
            None,  # c10d assigns node ranks: SLURM_NODEID does not count
            SLURM_JOB,
        ),
    ],
    ids=lambda v: None if not isinstance(v, dict) else ",".join(v),
)
def test_flags_override_slurm(
    kw: dict[str, object], endpoint: str, nnodes: int, node_rank: int | None, job: str
) -> None:
    p = plan(env=SRUN_STEP, **kw)  # type: ignore[arg-type]
    assert p.config is not None
    assert (p.config.endpoint, p.config.nnodes, p.config.node_rank) == (endpoint, nnodes, node_rank)
    assert p.default_job == job


def test_nnodes_1_under_a_slurm_step_is_one_node() -> None:
    p = plan(env=SRUN_STEP, nnodes="1")
    assert (p.config, p.master_addr, p.default_job) == (None, LOCALHOST, SLURM_JOB)


def test_explicit_single_node_under_slurm_refuses_a_node_rank() -> None:
    err = usage_error(env={**SRUN_STEP, "SLURM_NODEID": "1"}, nnodes="1:1", node_rank=1)
    assert err.message == "--node-rank 1 needs --nnodes greater than 1"


def test_batch_script_of_one_node_is_a_single_node_job() -> None:
    """The batch script of a one-node allocation: nothing to join; SLURM names the job."""
    p = plan(env=BATCH_1_NODE)
    assert p == NodePlan(None, "train_slurm77", LOCALHOST, None)


def test_batch_script_with_explicit_nnodes_1_is_a_single_node_job() -> None:
    p = plan(env=BATCH_2_NODES, nnodes="1")
    assert (p.config, p.default_job) == (None, "train_slurm4242")


def test_max_restarts_under_a_multi_node_slurm_step() -> None:
    p = plan(env=SRUN_STEP, max_restarts=2)
    assert p.config is not None and p.config.nnodes > 1


# -- make_spec: the ranks of one node ----------------------------------------------------


def options(script: Path, **kw: object) -> StartOptions:
    """test_placement's options, as a multi-node user gives them: no job id, address or port."""
    defaults: dict[str, object] = dict(nproc=3, job=None, master_addr=None, master_port=None)
    return placement_options(script, **{**defaults, **kw})


NO_MACHINE = Machine(Untouchable(), Untouchable())

# Node 1 of three, with 2, 3 and 2 ranks: its ranks are 2, 3, 4 of 7.
NODES = (
    NodeInfo(node=0, host="node0", first_rank=0, nproc=2, pid=100),
    NodeInfo(node=1, host="node1", first_rank=2, nproc=3, pid=101),
    NodeInfo(node=2, host="node2", first_rank=5, nproc=2, pid=102),
)


def layout(**kw: object) -> Layout:
    base: dict[str, object] = dict(
        node_rank=1,
        nnodes=3,
        world_size=7,
        master_addr="node0",
        master_port=29500,
        use_agent_store=True,
        run_id="",
        endpoint="node0:29500",
        nodes=NODES,
    )
    return Layout(**{**base, **kw})  # type: ignore[arg-type]


def spec(
    script: Path, env: Mapping[str, str] | None = None, lay: Layout | None = None, **kw: object
) -> JobSpec:
    return make_spec(options(script, **kw), env or {}, str(script.parent), NO_MACHINE, lay)


def test_a_multi_node_job_is_planned_once(script: Path) -> None:
    """start.py drafts the job once (options checked, ranks placed); the rendezvous's
    layout only numbers its ranks, exactly as planning with the layout would."""
    nodes = NodeOptions(nnodes="3", node_rank=1)
    opts = options(script, job="j", master_addr="node0", master_port=29500, nodes=nodes)
    draft = draft_job(opts, {}, str(script.parent), NO_MACHINE)
    before = number_ranks(draft)
    after = number_ranks(draft, layout())
    assert [r.rank for r in before.ranks] == [0, 1, 2] and before.layout is None
    assert after == make_spec(opts, {}, str(script.parent), NO_MACHINE, layout())
    assert [r.rank for r in after.ranks] == [2, 3, 4] and after.world_size == 7


def test_multi_node_ranks_get_torchruns_environment(script: Path) -> None:
    nodes = NodeOptions(nnodes="3", node_rank=1)
    s = spec(script, lay=layout(), job="j", master_addr="node0", master_port=29500, nodes=nodes)
    assert [r.rank for r in s.ranks] == [2, 3, 4]
    assert [r.local_rank for r in s.ranks] == [0, 1, 2]
    assert [r.unit for r in s.ranks] == [f"gpulaunch-j-rank{n}.scope" for n in (2, 3, 4)]
    for local, r in enumerate(s.ranks):
        rank = 2 + local
        expected = {
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": "7",
            "LOCAL_WORLD_SIZE": "3",
            "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "3",
            "ROLE_NAME": "default",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": "7",
            "MASTER_ADDR": "node0",
            "MASTER_PORT": "29500",
            "TORCHELASTIC_RUN_ID": "j",
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "OMP_NUM_THREADS": "1",
            "GPULAUNCH_JOB": "j",
            "GPULAUNCH_UNIT": f"gpulaunch-j-rank{rank}.scope",
        }
        assert expected.items() <= r.env.items()
    assert (s.nproc, s.world_size, s.master_addr, s.master_port) == (3, 7, "node0", 29500)
    assert s.layout == layout()
    assert s.node_config == NodeConfig(
        backend=Backend.STATIC,
        endpoint="node0:29500",
        run_id="j",
        nnodes=3,
        nproc=3,
        job="j",
        node_rank=1,
    )


def test_multi_node_store_comes_from_the_layout(script: Path) -> None:
    """c10d: MASTER_ADDR/PORT are the rendezvous' bootstrap store; agent store as it says."""
    nodes = NodeOptions(nnodes="3", rdzv_backend="c10d", rdzv_endpoint="rdv", rdzv_id="exp")
    lay = layout(master_addr="10.0.0.5", master_port=41234, use_agent_store=False)
    s = spec(script, lay=lay, job="j", nodes=nodes)
    for r in s.ranks:
        assert r.env["MASTER_ADDR"] == "10.0.0.5" and r.env["MASTER_PORT"] == "41234"
        assert r.env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert r.env["TORCHELASTIC_RUN_ID"] == "exp"  # --rdzv-id, not --job
        assert r.env["GPULAUNCH_JOB"] == "j"
    assert s.node_config is not None and s.node_config.endpoint == "rdv:29400"


def test_multi_node_on_node_0(script: Path) -> None:
    lay = layout(node_rank=0, nodes=(NODES[0], NODES[1]), nnodes=2, world_size=5)
    s = spec(script, lay=lay, job="j", nproc=2, nodes=NodeOptions(nnodes="2"))
    assert [r.rank for r in s.ranks] == [0, 1]
    assert [r.env["GROUP_RANK"] for r in s.ranks] == ["0", "0"]
    assert [r.env["WORLD_SIZE"] for r in s.ranks] == ["5", "5"]
    assert [r.env["GROUP_WORLD_SIZE"] for r in s.ranks] == ["2", "2"]


def test_multi_node_before_the_rendezvous(script: Path) -> None:
    """Without a layout the options are only checked: planned as node 0 of an unknown world."""
    s = spec(script, job="j", nodes=NodeOptions(nnodes="3", node_rank=2))
    assert s.layout is None and s.node_config is not None
    assert [r.rank for r in s.ranks] == [0, 1, 2]
    for r in s.ranks:
        assert r.env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert r.env["GROUP_WORLD_SIZE"] == "3"


@pytest.mark.parametrize(
    ("kw", "env", "job"),
    [
        ({"job": "mine", "nodes": NodeOptions(nnodes="2", rdzv_id="exp")}, {}, "mine"),
        ({"nodes": NodeOptions(nnodes="2", rdzv_id="exp")}, {}, "exp-node0"),
        ({"nodes": NodeOptions(rdzv_id="exp")}, {}, "exp"),
        ({"nodes": NodeOptions()}, SRUN_STEP, SLURM_JOB),
        ({"nodes": NodeOptions(rdzv_id="exp")}, SRUN_STEP, "exp"),
        ({"job": "mine", "nodes": NodeOptions()}, SRUN_STEP, "mine"),
        (
            {"nodes": NodeOptions(nnodes="2"), "master_addr": "node0"},
            {},
            digest_job("node0:29500") + "-node0",
        ),
    ],
)
def test_default_job_id(script: Path, kw: dict[str, object], env: dict[str, str], job: str) -> None:
    """--job, else --rdzv-id, else SLURM's name, else the script's stem and the endpoint's hash."""
    assert spec(script, env, **kw).job == job


def test_default_job_id_differs_per_node_and_the_run_id_does_not(script: Path) -> None:
    specs = [
        spec(script, nodes=NodeOptions(nnodes="2", node_rank=n), master_addr="node0")
        for n in (0, 1)
    ]
    assert [s.job for s in specs] == [digest_job("node0:29500") + f"-node{n}" for n in (0, 1)]
    for s in specs:
        assert s.node_config is not None and s.node_config.run_id == digest_job("node0:29500")
        assert s.ranks[0].env["TORCHELASTIC_RUN_ID"] == digest_job("node0:29500")


def test_job_and_rdzv_id_both_given(script: Path) -> None:
    nodes = NodeOptions(nnodes="3", node_rank=1, rdzv_id="exp")
    s = spec(script, lay=layout(), job="mine", nodes=nodes)
    assert s.job == "mine" and s.ranks[0].unit == "gpulaunch-mine-rank2.scope"
    assert s.ranks[0].env["TORCHELASTIC_RUN_ID"] == "exp"
    assert s.node_config is not None and (s.node_config.job, s.node_config.run_id) == (
        "mine",
        "exp",
    )


def test_single_node_is_unchanged(script: Path) -> None:
    a, b = spec(script), spec(script)
    assert re.fullmatch(r"train_[0-9a-f]{6}", a.job) and a.job != b.job  # random, not derived
    assert a.node_config is None and a.layout is None
    assert a.master_addr == "127.0.0.1" and 0 < a.master_port < 65536  # a free port
    assert a.world_size == 3
    for r in a.ranks:
        assert r.env["RANK"] == r.env["LOCAL_RANK"] == r.env["ROLE_RANK"] == str(r.local_rank)
        assert r.env["WORLD_SIZE"] == r.env["LOCAL_WORLD_SIZE"] == "3"
        assert (r.env["GROUP_RANK"], r.env["GROUP_WORLD_SIZE"]) == ("0", "1")
        assert r.env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert r.env["TORCHELASTIC_RUN_ID"] == a.job
        assert r.env["MASTER_PORT"] == str(a.master_port)
        assert r.unit == f"gpulaunch-{a.job}-rank{r.local_rank}.scope"


def test_single_node_keeps_given_addr_and_port(script: Path) -> None:
    s = spec(script, job="j", master_addr="127.0.0.1", master_port=29512)
    assert (s.master_addr, s.master_port) == ("127.0.0.1", 29512)
    assert s.ranks[0].env["MASTER_PORT"] == "29512"


def test_single_node_ignores_a_layout(script: Path) -> None:
    s = spec(script, lay=layout(), job="j")
    assert s.layout is None and [r.rank for r in s.ranks] == [0, 1, 2]
    assert s.ranks[0].env["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def test_single_node_under_a_one_node_slurm_job(script: Path) -> None:
    s = spec(script, BATCH_1_NODE)
    assert s.job == "train_slurm77" and s.node_config is None
    assert s.master_addr == LOCALHOST  # not SLURM's first host: nothing to meet there


def test_make_spec_passes_usage_errors_on(script: Path) -> None:
    with pytest.raises(UsageError, match="a range of nodes needs the c10d") as info:
        spec(script, nodes=NodeOptions(nnodes="2:3"), max_restarts=1)
    assert info.value.exit_code == 2


# -- the command line: one line on stderr, exit status 2 ---------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--nnodes", "1:4"],
            "--nnodes 1:4: a range of nodes needs the c10d or gpulaunch rendezvous",
        ),
        (["--nnodes", "0"], "--nnodes must be between 1 and 65536, not 0"),
        (["--nnodes", "2", "--rdzv-backend", "etcd"], "--rdzv-backend etcd is not supported"),
        (["--nnodes", "2", "--rdzv_backend", "c10d"], "--rdzv-backend c10d needs"),
        (["--node-rank", "1"], "--node-rank 1 needs --nnodes greater than 1"),
        (["--nnodes", "2", "--node_rank", "2"], "node rank 2 is not a node of a 2-node job"),
        (["--nnodes", "2:1"], "--nnodes 2:1: the minimum is more than the maximum"),
        (["--nnodes", "2", "--rdzv-conf", "timeout"], "--rdzv-conf 'timeout'"),
        (["--nnodes", "2", "--rdzv-endpoint", "rdv:x"], "--rdzv-endpoint 'rdv:x' is not"),
    ],
)
def test_cli_exit_status_2(
    argv: list[str],
    message: str,
    script: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(script.parent)
    for name in ("SLURM_JOB_ID", "SLURM_JOBID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["render", *argv, script.name])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"gpulaunch: error: {message}")


@pytest.mark.parametrize("node_rank", [0, 1])
def test_c10d_ignores_node_rank_as_torchrun_does(node_rank: int) -> None:
    """Scripts pass --node_rank=$SLURM_NODEID whatever the backend; c10d assigns ranks."""
    p = plan(nnodes="2", rdzv_backend="c10d", rdzv_endpoint="rdv", node_rank=node_rank)
    assert p.config is not None and p.config.node_rank is None


def test_several_nodes_need_torch_in_the_launchers_python(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    with pytest.raises(UsageError) as info:
        make_spec(options(script, nodes=NodeOptions(nnodes="2")), {}, str(script.parent))
    assert "needs torch" in info.value.message and info.value.exit_code == 2
