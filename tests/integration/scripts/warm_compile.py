"""torch.compile in a rank (tests/integration/test_warm.py: warm as cold): inductor's
compile of a small function on CPU, its result checked."""

import sys

import torch


def main() -> None:
    f = torch.compile(lambda x: x * 2 + 1)
    y = f(torch.ones(4)).tolist()
    print(f"compiled {y}", flush=True)
    sys.exit(0 if y == [3.0] * 4 else 1)


if __name__ == "__main__":
    main()
