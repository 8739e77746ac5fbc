"""What a job will be, decided before anything starts: options → `JobSpec`.

- `spec.py`: the start options and `make_spec`; `bounds.py`: the largest numbers taken;
- `environment.py`: torchrun's environment contract, per rank;
- `placement.py`, `topology.py`, `gpus.py`: which GPUs and CPUs each rank gets;
- `nodes.py`: how this node joins a multi-node job (torchrun's flags, SLURM's variables);
- `leaserequest.py`: `--gpus auto:N` as the command line gives it.

A bad option fails here, before any unit or process exists.
"""
