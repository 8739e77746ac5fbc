"""The vocabulary and process primitives every feature shares (the lowest layer but errors).

Unit names, what a node is, forking and gating a process, signal plumbing, the open-file
limit, a process's own cgroup, "am I in a Slurm step", the detach fork protocol, finding the
user bus, printable argument text, the terminal relayed to the rank that reads it. Nothing
here imports a feature folder (docs/architecture.md draws the layers; `lint-imports` checks
them).
"""
