"""bench/nodestart.py: each launcher's and peer's marks become its node's milestones."""

from __future__ import annotations

from bench.nodestart import NPROC, timeline


def test_marks_are_placed_on_the_node_whose_launcher_they_descend_from() -> None:
    # node 0: launcher 100 forks its watcher 101 (the keeper stays), which spawns peer 102;
    # node 1: launcher 200 is the watcher, peer 202.
    marks = [
        (10.00, 100, "python", "up ppid 1 gpulaunch start"),
        (10.05, 200, "python", "up ppid 1 gpulaunch start"),
        (10.29, 100, "os.fork", ""),
        (10.30, 101, "forked", "ppid 100"),
        (10.30, 101, "os.fork", ""),
        (10.31, 102, "forked", "ppid 101"),
        (10.32, 102, "os.exec", "python -m gpulaunch.multinode.peer {}"),
        (10.40, 102, "python", "up ppid 101 python -m gpulaunch.multinode.peer"),
        (10.45, 202, "python", "up ppid 200 python -m gpulaunch.multinode.peer"),
        (10.50, 102, "import", "torch"),
        (12.00, 102, "rdzv.next", "done"),
        (12.01, 102, "peer.joined", "sent"),
        (12.02, 101, "watcher.joined", "received"),
        (12.10, 101, "os.fork", ""),
        (12.20, 101, "os.fork", ""),
        (12.30, 202, "rdzv.next", "done"),
    ]
    run = {
        "launcher": "direct",
        "starts": {"100": [0, 10.0], "200": [1, 10.05]},
        "marks": marks,
        "stamps": {str(r): 12.5 + r / 100 for r in range(2 * NPROC)},
    }
    tl = timeline(run)
    ms = {n: {k: round(v * 1000) for k, v in p.items()} for n, p in tl.items()}
    assert ms[0]["launcher: interpreter up"] == 0
    assert ms[0]["peer: exec"] == 320
    assert ms[0]["peer: interpreter up"] == 400
    assert ms[0]["import torch begins"] == 500
    assert ms[0]["rdzv: round done"] == 2000
    assert ms[0]["watcher: layout received"] == 2020
    assert ms[0]["ranks: first fork/spawn"] == 2100  # not the keeper's fork at 10.30
    assert ms[0]["ranks: last fork/spawn"] == 2200
    assert ms[0]["ranks: last rank's first line"] == 2500 + 70
    assert ms[1]["peer: interpreter up"] == 400  # from node 1's own start, 10.05
    assert ms[1]["rdzv: round done"] == 2250
    assert ms[1]["ranks: first rank's first line"] == 2450 + 80
