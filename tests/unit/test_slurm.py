"""SLURM step detection, fed synthetic SLURM environments.

No SLURM is installed here: every environment below is a dict written to look
like what srun or sbatch export (srun(1), sbatch(1), "OUTPUT ENVIRONMENT VARIABLES").
"""

from __future__ import annotations

import pytest

from gpulaunch.base.slurm import (
    SlurmStep,
    first_host,
    slurm_job_name,
    slurm_master_port,
    slurm_step,
)
from gpulaunch.errors import UsageError

# What `srun --nodes=2 --ntasks-per-node=1` exports on the second node of a
# larger allocation (the job has 4 nodes, the step 2).
SRUN_2_NODES = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOBID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_JOB_NUM_NODES": "4",
    "SLURM_NNODES": "2",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_NTASKS": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_JOB_NODELIST": "gpu[07-09,12]",
    "SLURM_NODELIST": "gpu[11-12]",
    "SLURM_STEP_NODELIST": "gpu[11-12]",
    "SLURMD_NODENAME": "gpu12",
    "SLURM_TASKS_PER_NODE": "1(x2)",
}


def with_env(**changes: str | None) -> dict[str, str]:
    """SRUN_2_NODES with some variables changed (None: removed)."""
    env = dict(SRUN_2_NODES)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def usage_error(env: dict[str, str]) -> UsageError:
    with pytest.raises(UsageError) as info:
        slurm_step(env)
    assert info.value.hint
    assert "\n" not in info.value.message
    return info.value


# --- hostlists ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("node1", "node1"),
        ("node1,node2", "node1"),
        ("gpu[07-09,12]", "gpu07"),
        ("gpu[12,07-09]", "gpu12"),  # SLURM keeps the order as written
        ("gpu[007]", "gpu007"),
        ("gpu[8-10]", "gpu8"),
        ("a[1-2]-b[3-4]", "a1-b3"),
        ("rack[0-1]n[00-03]", "rack0n00"),
        ("gpu[1-2],cpu[3-4]", "gpu1"),
        ("cpu1,gpu[00-03]", "cpu1"),
        ("[3-4]", "3"),
        ("node-1.example.org", "node-1.example.org"),
        (" node1 ", "node1"),
    ],
)
def test_first_host(nodelist: str, first: str) -> None:
    assert first_host(nodelist) == first


@pytest.mark.parametrize(
    ("nodelist", "why"),
    [
        ("", "it is empty"),
        ("   ", "it is empty"),
        ("gpu[1-2", "unbalanced '['"),
        ("gpu1-2]", "unbalanced ']'"),
        ("gpu]1[", "unbalanced ']'"),
        ("gpu[[1-2]]", "unbalanced '['"),
        ("gpu[1]]", "unbalanced ']'"),
        ("gpu[]", "empty brackets"),
        ("gpu[5-3]", "range '5-3' runs backwards"),
        ("gpu[1-]", "bad range '1-'"),
        ("gpu[-1]", "bad range '-1'"),
        ("gpu[a-b]", "bad range 'a-b'"),
        ("gpu[1,,2]", "bad range ''"),
        ("gpu[1-2-3]", "bad range '1-2-3'"),
        ("node1,,node2", "empty entry"),
        ("node1,", "empty entry"),
        ("node1,gpu[5-3]", "runs backwards"),  # the whole list is checked, not only the first
        ("node 1", "whitespace"),
    ],
)
def test_first_host_rejects_malformed(nodelist: str, why: str) -> None:
    with pytest.raises(UsageError) as info:
        first_host(nodelist)
    assert info.value.message.startswith(f"{nodelist!r} is not a SLURM hostlist")
    assert why in info.value.message
    assert info.value.hint


# --- ports and names ------------------------------------------------------------


@pytest.mark.parametrize(
    ("job_id", "port"),
    [
        ("4242", 24242),
        ("1234567", 24567),
        ("10000", 20000),
        ("9999", 29999),
        ("1234_5", 21234),  # an array task shares its array job's port
        ("1234+1", 21234),  # a heterogeneous job component too
        ("abc", 20000),
        ("", 20000),
    ],
)
def test_master_port(job_id: str, port: int) -> None:
    assert slurm_master_port(job_id) == port


@pytest.mark.parametrize(
    ("job_id", "step_id", "name"),
    [
        ("4242", None, "train_slurm4242"),
        ("4242", "0", "train_slurm4242.0"),
        ("4242", "3", "train_slurm4242.3"),
        ("1234_5", "1", "train_slurm1234_5.1"),
    ],
)
def test_job_name(job_id: str, step_id: str | None, name: str) -> None:
    assert slurm_job_name(job_id, step_id, "train") == name


# --- the step -------------------------------------------------------------------


def test_not_under_slurm() -> None:
    assert slurm_step({}) is None
    assert slurm_step({"SLURM_JOB_ID": ""}) is None
    assert slurm_step({"HOME": "/root", "SLURM_NNODES": "2"}) is None


def test_srun_step_of_two_nodes() -> None:
    assert slurm_step(SRUN_2_NODES) == SlurmStep(
        job_id="4242",
        step_id="0",
        nnodes=2,
        node_rank=1,
        master_addr="gpu11",
        master_port=24242,
    )


def test_every_node_of_a_step_agrees_on_the_master() -> None:
    steps = [slurm_step(with_env(SLURM_NODEID=str(n))) for n in range(2)]
    assert [s.node_rank for s in steps if s] == [0, 1]
    assert {(s.master_addr, s.master_port) for s in steps if s} == {("gpu11", 24242)}


def test_array_job() -> None:
    step = slurm_step(with_env(SLURM_JOB_ID="777_3", SLURM_NODEID="0"))
    assert step is not None
    assert (step.job_id, step.master_port) == ("777_3", 20777)


def test_zero_padded_nodelist() -> None:
    step = slurm_step(with_env(SLURM_STEP_NODELIST="rack[0-1]n[007-010]"))
    assert step is not None and step.master_addr == "rack0n007"


@pytest.mark.parametrize(
    ("removed", "nnodes"),
    [
        ((), 2),  # SLURM_STEP_NUM_NODES
        (("SLURM_STEP_NUM_NODES",), 2),  # SLURM_NNODES
        (("SLURM_STEP_NUM_NODES", "SLURM_NNODES"), 4),  # SLURM_JOB_NUM_NODES
    ],
)
def test_node_count_precedence(removed: tuple[str, ...], nnodes: int) -> None:
    env = with_env(**dict.fromkeys(removed))
    step = slurm_step(env)
    assert step is not None and step.nnodes == nnodes


@pytest.mark.parametrize(
    ("removed", "master"),
    [
        ((), "gpu11"),  # SLURM_STEP_NODELIST
        (("SLURM_STEP_NODELIST",), "gpu07"),  # SLURM_JOB_NODELIST
        (("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"), "gpu11"),  # SLURM_NODELIST
    ],
)
def test_nodelist_precedence(removed: tuple[str, ...], master: str) -> None:
    step = slurm_step(with_env(**dict.fromkeys(removed)))
    assert step is not None and step.master_addr == master


def test_batch_script_on_one_node() -> None:
    # sbatch without srun: no step, and here not even a node count.
    assert slurm_step({"SLURM_JOB_ID": "99"}) == SlurmStep(
        job_id="99",
        step_id=None,
        nnodes=1,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=20099,
    )


def test_batch_script_tasks_are_not_srun_tasks() -> None:
    # In a batch script SLURM_NTASKS is the job's request; one copy of the script runs.
    env = {
        "SLURM_JOB_ID": "99",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS": "8",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "gpu03",
    }
    step = slurm_step(env)
    assert step is not None and (step.nnodes, step.master_addr) == (1, "gpu03")


def test_one_node_without_node_id() -> None:
    one = {"SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1", "SLURM_STEP_NODELIST": "gpu12"}
    step = slurm_step(with_env(SLURM_STEP_NUM_NODES="1", SLURM_NODEID=None, **one))
    assert step is not None and (step.nnodes, step.node_rank) == (1, 0)


def test_empty_variable_counts_as_unset() -> None:
    step = slurm_step(with_env(SLURM_STEP_NUM_NODES="", SLURM_STEP_NODELIST=""))
    assert step is not None and (step.nnodes, step.master_addr) == (2, "gpu07")


# --- errors -------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["two", "-1", "0", "1.5", "+2"])
def test_bad_node_count(value: str) -> None:
    error = usage_error(with_env(SLURM_STEP_NUM_NODES=value))
    assert error.message == f"SLURM_STEP_NUM_NODES={value!r} is not a positive integer"


def test_bad_node_count_names_the_variable_read() -> None:
    error = usage_error(with_env(SLURM_STEP_NUM_NODES=None, SLURM_NNODES="x"))
    assert error.message.startswith("SLURM_NNODES='x'")


@pytest.mark.parametrize("value", ["one", "-1", "1e0"])
def test_bad_node_id(value: str) -> None:
    error = usage_error(with_env(SLURM_NODEID=value))
    assert error.message == f"SLURM_NODEID={value!r} is not a non-negative integer"


@pytest.mark.parametrize("node_id", ["2", "7"])
def test_node_id_outside_the_step(node_id: str) -> None:
    error = usage_error(with_env(SLURM_NODEID=node_id))
    assert error.message == f"SLURM_NODEID={node_id} is not below the step's 2 nodes"


def test_missing_node_id_on_several_nodes() -> None:
    error = usage_error(with_env(SLURM_NODEID=None))
    assert error.message == "SLURM_NODEID is not set in a SLURM step of 2 nodes"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "8"},
            "srun started 8 tasks on 2 nodes",
        ),
        (
            {"SLURM_STEP_NUM_TASKS": None, "SLURM_NTASKS": "4"},
            "srun started 4 tasks on 2 nodes",
        ),
        (
            {"SLURM_STEP_NUM_TASKS": "3", "SLURM_NTASKS": None},
            "srun started 3 tasks on 2 nodes",
        ),
        (
            {"SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "0"},
            "srun started 2 tasks on 1 node",
        ),
    ],
)
def test_more_than_one_task_per_node(changes: dict[str, str | None], message: str) -> None:
    error = usage_error(with_env(**changes))
    assert error.message == (
        f"{message}; gpulaunch starts the ranks of a node itself and wants one task per node"
    )
    assert error.hint == "use srun --ntasks-per-node=1 (or sbatch --ntasks-per-node=1)"


def test_bad_task_count() -> None:
    error = usage_error(with_env(SLURM_STEP_NUM_TASKS="many"))
    assert error.message == "SLURM_STEP_NUM_TASKS='many' is not a positive integer"


def test_missing_nodelist_on_several_nodes() -> None:
    env = with_env(SLURM_STEP_NODELIST=None, SLURM_JOB_NODELIST=None, SLURM_NODELIST=None)
    error = usage_error(env)
    assert error.message == (
        "no SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or SLURM_NODELIST in a SLURM step of 2 nodes"
    )


@pytest.mark.parametrize(
    ("variable", "value", "why"),
    [
        ("SLURM_STEP_NODELIST", "gpu[11-12", "unbalanced '['"),
        ("SLURM_STEP_NODELIST", "gpu[5-3]", "runs backwards"),
        ("SLURM_STEP_NODELIST", "gpu[]", "empty brackets"),
        ("SLURM_JOB_NODELIST", "gpu11]", "unbalanced ']'"),
    ],
)
def test_malformed_nodelist_names_the_variable(variable: str, value: str, why: str) -> None:
    removed = {"SLURM_STEP_NODELIST": None} if variable == "SLURM_JOB_NODELIST" else {}
    error = usage_error(with_env(**removed, **{variable: value}))
    assert error.message.startswith(f"{variable}={value!r} is not a SLURM hostlist")
    assert why in error.message
