"""`--gpus auto:N` as the command line gives it (request.py takes the lease)."""

from __future__ import annotations

from dataclasses import dataclass

from gpulaunch.plan.bounds import MAX_GPU

PREFIX = "auto:"


@dataclass(frozen=True)
class LeaseRequest:
    """`--gpus auto:N`: N GPUs of the pool that no other job holds."""

    count: int

    def __str__(self) -> str:
        return f"{PREFIX}{self.count}"


def parse_request(text: str) -> LeaseRequest | None:
    """`auto:N` (or `free:N`) as a request; None if `text` is not one (a list of GPUs, then)."""
    head, sep, raw = text.partition(":")
    if not sep or head not in ("auto", "free"):
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_GPU:
        raise ValueError(f"{head}:N needs a number of GPUs from 1 to {MAX_GPU}, not {raw!r}")
    return LeaseRequest(int(raw))
