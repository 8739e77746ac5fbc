"""Several nodes: one watcher per node, joined by torch's rendezvous (docs/multinode.md).

- `addresses.py`: the addresses a node is given, checked before it joins;
- `peer.py`: the process that imports torch and talks to the other nodes, with
  `rendezvous.py`, torch's rendezvous across rounds, and `membership.py`, gpulaunch's own
  (`--rdzv-backend gpulaunch`: a lost node is out within `--node-timeout`);
- `roster.py`: each round's membership, written for the ranks (GPULAUNCH_MEMBERSHIP_FILE);
- `peerlink.py`: the watcher's end of that link, and the rendezvous wait;
- `othernodes.py`: what the watcher knows of the other nodes while the job runs;
- `rounds.py`: whether every node goes on to another round after a failure.

What the nodes agree on (`Layout`, `NodeFailure`) is gpulaunch/base/protocol.py, how a
node joins (torchrun's flags, SLURM's variables) gpulaunch/plan/nodes.py.
"""
