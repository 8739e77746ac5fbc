"""Several nodes: one watcher per node, joined by torch's rendezvous (docs/multinode.md).

- `options`: torchrun's multi-node flags (and SLURM's variables) → how to join;
- `slurm`: what srun tells a step (node count and rank, the first host);
- `protocol`: what the nodes agree on (`Layout`, `NodeFailure`) and the JSON lines
  the watcher and its peer exchange;
- `peer`: the process that imports torch and talks to the other nodes;
- `peerlink`: the watcher's end of that link, and the rendezvous wait;
- `othernodes`: what the watcher knows of the other nodes while the job runs.
"""
