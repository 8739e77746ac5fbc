"""DataLoader workers and a multiprocessing forkserver child from a rank
(tests/integration/test_warm.py: a warm rank behaves as a cold one). Stdlib and torch."""

import multiprocessing
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset


def square(x: int) -> int:
    return x * x


def main() -> None:
    data = TensorDataset(torch.arange(8, dtype=torch.float32))
    total = sum(float(b[0].sum()) for b in DataLoader(data, batch_size=2, num_workers=2))
    with multiprocessing.get_context("forkserver").Pool(1) as pool:
        squared = pool.map(square, [3])
    print(f"rank {os.environ['RANK']} loader {total:g} forkserver {squared}", flush=True)
    sys.exit(0 if total == 28 and squared == [9] else 1)


if __name__ == "__main__":
    main()
