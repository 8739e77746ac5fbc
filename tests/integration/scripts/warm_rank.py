"""A rank that writes down what it was started as (tests/integration/test_warm.py).

Its first lines read, before anything else runs: whether torch is already imported (a
warm rank's is), its cgroup (it must be its own scope's or cgroup's already), the warm
process's and its parent's cgroups. Then it writes rank<N>.a<ATTEMPT>.json in --dir and
does what its arguments say: --exit-rank R --code C (rank R exits C), --kill-rank R
--signal S (rank R dies of signal S), --spawn (a multiprocessing "spawn" child answers),
--read-stdin (rank 0 records its stdin). Stdlib only.
"""

import sys

WARM = "torch" in sys.modules  # noqa: E402 - before any import of ours: what the fork gave
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402


def cgroup(pid: int | str) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        unified = [line for line in f.read().splitlines() if line.startswith("0::")]
    return unified[0][3:] if unified else ""


def warm_processes() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"gpulaunch-warm " + os.environ["GPULAUNCH_JOB"].encode()):
                    found.append(f"{pid} {cgroup(pid)}")
        except OSError:
            continue
    return found


FIRST = {
    "warm": WARM,
    "cgroup": cgroup("self"),
    "parent_cgroup": cgroup(os.getppid()),
    "own_group": os.getpgid(0) == os.getpid(),
}


def double(x: int) -> int:
    return 2 * x


def main() -> None:
    args = sys.argv[1:]

    def opt(name: str) -> str | None:
        return args[args.index(name) + 1] if name in args else None

    rank = int(os.environ["RANK"])
    out = {
        **FIRST,
        "argv": sys.argv,
        "orig_argv": sys.orig_argv,
        "file": __file__,
        "spec": getattr(__spec__, "name", None),
        "path0": sys.path[0],
        "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MARK")},
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "warm_processes": warm_processes(),
        "stdout_isatty": sys.stdout.isatty(),
        "stdout_name": sys.stdout.name,
    }
    with open("/proc/self/cmdline", "rb") as f:
        out["cmdline"] = f.read().rstrip(b"\0").decode().split("\0")
    if "--spawn" in args:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(1) as pool:
            out["spawned"] = pool.map(double, [21])
    if "--read-stdin" in args and rank == 0:
        out["stdin"] = sys.stdin.read()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    path = os.path.join(opt("--dir") or ".", f"rank{rank}.a{attempt}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.rename(path + ".tmp", path)
    print(f"rank {rank} says hello on stdout", flush=True)
    print(f"rank {rank} says hello on stderr", file=sys.stderr, flush=True)
    fail_attempt = opt("--fail-attempt")
    if fail_attempt is not None and attempt != fail_attempt:
        return
    if opt("--exit-rank") == str(rank):
        sys.exit(int(opt("--code") or 1))
    if opt("--kill-rank") == str(rank):
        os.kill(os.getpid(), getattr(signal, opt("--signal") or "SIGKILL"))
    if opt("--raise-rank") == str(rank):
        raise RuntimeError(f"rank {rank} raises")
    if opt("--interrupt-rank") == str(rank):
        raise KeyboardInterrupt


if __name__ == "__main__":
    main()
