"""A rank whose entry point uses torchelastic's @record: its traceback goes to the error file."""

import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record


def inner(rank: int) -> None:
    if rank == int(sys.argv[sys.argv.index("--fail-rank") + 1]):
        raise ValueError(f"recorded failure in rank {rank}")
    import time

    time.sleep(60)


@record
def main() -> None:
    inner(int(os.environ["RANK"]))


if __name__ == "__main__":
    main()
