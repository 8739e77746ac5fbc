"""From torchrun's multi-node options (or SLURM's environment) to how this node joins its job.

Pure: reads the mapping it is given, starts nothing. The rules follow
torch/distributed/run.py where torchrun has one (static is the default
backend, --master-addr/--master-port are its endpoint, 29500 its port).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace

from gpulaunch.base.protocol import HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, Backend, NodeConfig
from gpulaunch.base.slurm import slurm_job_name, slurm_step
from gpulaunch.errors import UsageError
from gpulaunch.plan.bounds import MAX_NNODES

GPULAUNCH_NODE_TIMEOUT = 2.0  # --node-timeout's default with --rdzv-backend gpulaunch
BEATS_PER_TIMEOUT = 20  # heartbeats per --node-timeout
STATIC_PORT = 29500  # torchrun's --master-port default
C10D_PORT = 29400  # torch's default port of a c10d rendezvous endpoint
LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class NodeOptions:
    """torchrun's multi-node flags, as given (None: not given)."""

    nnodes: str | None = None
    node_rank: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: str | None = None
    local_addr: str | None = None
    node_timeout: float | None = None  # --node-timeout


def liveness(backend: Backend, node_timeout: float | None) -> tuple[float, float, float]:
    """The heartbeat: (interval, silence that loses a node, --node-timeout).

    gpulaunch's own rendezvous: 2 s by default; the others keep 6 s (a beat a second,
    lost after 5 s of silence). Else a beat every 1/20 of the timeout, a node declared lost
    after the timeout less two beats: its last beat is seen up to a beat late, and judged
    at the next.
    """
    if node_timeout is None:
        if backend is not Backend.GPULAUNCH:
            return HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT + HEARTBEAT_INTERVAL
        node_timeout = GPULAUNCH_NODE_TIMEOUT
    interval = node_timeout / BEATS_PER_TIMEOUT
    return interval, node_timeout - 2 * interval, node_timeout


@dataclass(frozen=True)
class NodePlan:
    """What the nodes imply for the job: how to join (None: one node) and its default id.

    A multi-node job's default id is this node's (or this launcher's): the nodes of one job
    may share one machine and its manager (`--nnodes 2` tried on localhost), where one id
    for both would collide. What makes them one job is the run id, `run_id` (--rdzv-id, else
    what every node derives alike from the endpoint).
    """

    config: NodeConfig | None
    default_job: str | None
    master_addr: str  # the single-node job's MASTER_ADDR (multi-node: the rendezvous decides)
    master_port: int | None
    run_id: str | None = None  # the run id with the default job id (None: the job id)

    def for_job(self, job: str, nproc: int) -> NodeConfig | None:
        if self.config is None:
            return None
        shared = self.run_id if job == self.default_job else None
        return replace(
            self.config, job=job, nproc=nproc, run_id=self.config.run_id or shared or job
        )


def node_job_id(run_id: str, node_rank: int | None) -> str:
    """This node's default id in a multi-node job: the run id and the node rank (static), or,
    where the rendezvous assigns node ranks later (c10d), a suffix of this launcher's."""
    suffix = f"node{node_rank}" if node_rank is not None else secrets.token_hex(3)
    return f"{run_id}-{suffix}"


def parse_nnodes(text: str) -> tuple[int, int]:
    """torchrun's --nnodes: N, or MIN:MAX (elastic: the job goes on with MIN to MAX nodes)."""
    low, _, high = text.partition(":")
    try:
        numbers = (int(low), int(high or low))
    except ValueError:
        raise UsageError(
            f"--nnodes must be a number of nodes, not {text!r}", "e.g. --nnodes 4 or --nnodes 2:4"
        ) from None
    for n in numbers:
        if not 1 <= n <= MAX_NNODES:
            raise UsageError(
                f"--nnodes must be between 1 and {MAX_NNODES}, not {n}", "e.g. --nnodes 4"
            )
    if numbers[0] > numbers[1]:
        raise UsageError(
            f"--nnodes {text}: the minimum is more than the maximum", "e.g. --nnodes 2:4"
        )
    return numbers


def split_endpoint(text: str, default_port: int, flag: str) -> tuple[str, int]:
    """HOST[:PORT] or [V6ADDR][:PORT], read as torch's parse_rendezvous_endpoint reads it."""
    endpoint = text.strip()
    if not endpoint.startswith("[") and endpoint.count(":") > 1:
        raise UsageError(f"{flag} {text!r}: an IPv6 address needs brackets", "e.g. [fd00::1]:29400")
    if endpoint.startswith("[") and endpoint.endswith("]"):
        host, rest = endpoint, []
    else:
        host, *rest = endpoint.rsplit(":", 1)
    if len(host) > 1 and host[0] == "[" and host[-1] == "]":
        host = host[1:-1]
    port = default_port
    if rest:
        port = int(rest[0]) if re.fullmatch(r"[0-9]{1,5}", rest[0]) else -1
    if not re.fullmatch(r"[\w.:-]+", host) or not 0 <= port < 65536:
        raise UsageError(
            f"{flag} {text!r} is not HOST[:PORT]",
            "e.g. node0.example:29400, 10.0.0.1:29400 or [fd00::1]:29400",
        )
    return host, port


def _endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _conf(text: str | None) -> tuple[tuple[str, str], ...]:
    if not text:
        return ()
    pairs = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(
                f"--rdzv-conf {text!r}: {item!r} is not KEY=VALUE",
                "e.g. --rdzv-conf join_timeout=900,timeout=900",
            )
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def plan_nodes(
    opts: NodeOptions,
    master_addr: str | None,
    master_port: int | None,
    max_restarts: int,
    stem: str,
    env: Mapping[str, str],
) -> NodePlan:
    """Check the multi-node options against each other and SLURM's environment."""
    slurm = slurm_step(env)
    default_job = opts.rdzv_id
    if default_job is None and slurm is not None:
        default_job = slurm_job_name(slurm.job_id, slurm.step_id, stem)
    min_nodes = None
    if opts.nnodes is not None:
        min_nodes, nnodes = parse_nnodes(opts.nnodes)
    elif slurm is not None:
        if slurm.step_id is None and slurm.nnodes > 1:
            raise UsageError(
                f"gpulaunch runs in the batch script of a {slurm.nnodes}-node SLURM allocation, "
                "not in an srun step, so the other nodes would never join",
                "start it on every node: srun --ntasks-per-node=1 gpulaunch start ...",
            )
        nnodes = slurm.nnodes
    else:
        nnodes = 1
    backend_name = opts.rdzv_backend or Backend.STATIC.value
    try:
        backend = Backend(backend_name)
    except ValueError:
        raise UsageError(
            f"--rdzv-backend {backend_name} is not supported",
            "use static (--node-rank, --master-addr), c10d or gpulaunch (--rdzv-endpoint)",
        ) from None
    single = nnodes == 1 and backend is Backend.STATIC and opts.rdzv_endpoint is None
    endpoint_port = (
        split_endpoint(opts.rdzv_endpoint, 1, "--rdzv-endpoint")[1] if opts.rdzv_endpoint else None
    )
    if endpoint_port == 0:
        # torchrun's single-node idiom (what --standalone means): port 0 picks a free
        # port, which no other node could know.
        if nnodes != 1:
            raise UsageError(
                f"--rdzv-endpoint {opts.rdzv_endpoint}: port 0 (a free port) works only for "
                f"one node, and this job has {nnodes}",
                "give the port every node can reach, e.g. node0.example:29400",
            )
        single = True
    if single:
        if opts.node_rank not in (None, 0):
            raise UsageError(
                f"--node-rank {opts.node_rank} needs --nnodes greater than 1",
                "give the number of nodes with --nnodes",
            )
        return NodePlan(None, default_job, master_addr or LOCALHOST, master_port)
    if min_nodes is not None and min_nodes != nnodes and not backend.elastic:
        raise UsageError(
            f"--nnodes {opts.nnodes}: a range of nodes needs the c10d or gpulaunch rendezvous "
            "(the static one numbers a fixed set of nodes)",
            "add --rdzv-backend c10d --rdzv-endpoint HOST:PORT, or give one number",
        )
    if backend is Backend.STATIC:
        if opts.rdzv_endpoint is not None:
            host, port = split_endpoint(opts.rdzv_endpoint, STATIC_PORT, "--rdzv-endpoint")
        else:
            host = master_addr or (slurm.master_addr if slurm else LOCALHOST)
            port = master_port or (slurm.master_port if slurm else STATIC_PORT)
        node_rank = opts.node_rank
        if node_rank is None:
            node_rank = slurm.node_rank if slurm is not None else 0
        if not 0 <= node_rank < nnodes:
            raise UsageError(
                f"node rank {node_rank} is not a node of a {nnodes}-node job",
                f"give --node-rank 0 to {nnodes - 1}",
            )
    else:
        if opts.rdzv_endpoint is None:
            raise UsageError(
                f"--rdzv-backend {backend} needs --rdzv-endpoint HOST[:PORT]",
                "give the address of one node, the same on every node",
            )
        # c10d assigns node ranks; torchrun ignores --node-rank here too (scripts pass
        # --node_rank=$SLURM_NODEID whatever the backend).
        host, port = split_endpoint(opts.rdzv_endpoint, C10D_PORT, "--rdzv-endpoint")
        node_rank = None
    endpoint = _endpoint(host, port)
    run_id = default_job
    if run_id is None:
        run_id = f"{stem}_{hashlib.sha256(endpoint.encode()).hexdigest()[:6]}"
    if slurm is None:  # (a Slurm step's nodes are one per machine: its name is theirs)
        default_job = node_job_id(run_id, node_rank)
    else:
        default_job = run_id
    config = NodeConfig(
        backend=backend,
        endpoint=endpoint,
        run_id=opts.rdzv_id or "",  # "": the job id (NodePlan.for_job)
        nnodes=nnodes,
        nproc=0,
        job="",
        node_rank=node_rank,
        local_addr=opts.local_addr,
        rdzv_conf=_conf(opts.rdzv_conf),
        min_nodes=min_nodes if min_nodes != nnodes else None,
    )
    interval, silent, node_timeout = liveness(backend, opts.node_timeout)
    config = replace(
        config,
        heartbeat_interval=interval,
        heartbeat_timeout=silent,
        node_timeout=node_timeout,
    )
    return NodePlan(config, default_job, master_addr or LOCALHOST, master_port, run_id)
