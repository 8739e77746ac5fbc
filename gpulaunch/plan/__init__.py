"""What a job will be, decided before anything starts: options → `JobSpec`.

- `spec`: the start options and `make_spec`;
- `environment`: torchrun's environment contract, per rank;
- `placement`, `topology`, `gpus`: which GPUs and CPUs each rank gets.

A bad option fails here, before any unit or process exists.
"""
