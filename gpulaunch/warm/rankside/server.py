"""The warm process: it imports what the ranks will import, then forks each rank on request.

Run by its path with the ranks' own Python (`python -u server.py JOB MODULES ROOM`; the
launcher's side is gpulaunch/warm/process.py), with its end of a SOCK_SEQPACKET socket at
fd 3. It imports MODULES (comma-separated; torch and torch.distributed first where this
Python has them), then says `{"ready": true}` or `{"cold": why}`. For each request (JSON:
argv, env, cwd, fds, death_signal, watcher; with the fds by SCM_RIGHTS, the rank's start
gate first) it checks that it is still safe to fork (one thread, CUDA not initialized),
forks a middle process that forks the rank and exits at once, so that the rank is
re-parented to the watcher, a child subreaper for that moment (the rank's pid is the
watcher's child: it reaps it and reads its exact status), and answers `{"pid": N}`.

The rank, held at its gate until the watcher has it contained (its scope or cgroup),
then becomes `python -u SCRIPT ARGS` (or `-m MODULE`): its fds, environment, sys.argv,
sys.orig_argv, sys.path[0], a fresh `__main__` with `__file__`/`__spec__`, its standard
streams made as CPython makes them, its exit status and signal deaths as CPython's. Stdlib
only, besides what it preloads; it never initializes CUDA.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import gc
import importlib
import importlib.machinery
import importlib.util
import io
import json
import os
import signal
import socket
import sys
import threading
import types
from typing import Any

SOCKET_FD = 3
GATE_CLOSED = 126  # as base/procs.py: the watcher went away before opening the gate
MAX_FDS = 64
DEFAULT_MODULES = ("torch", "torch.distributed")
_OURS = os.path.abspath(__file__)


def main() -> None:
    job, modules, _room = sys.argv[1], sys.argv[2], sys.argv[3]
    set_cmdline([f"gpulaunch-warm {job}"])
    sock = socket.socket(fileno=SOCKET_FD)
    why = preload([m for m in modules.split(",") if m])
    _send(sock, {"cold": why} if why else {"ready": True})
    if why:
        os._exit(0)
    request, fds = serve(sock)
    become(sock, request, fds)


def preload(modules: list[str]) -> str | None:
    """Import the defaults this Python has, then `modules`; why not safe, else None."""
    wanted = [m for m in DEFAULT_MODULES if importlib.util.find_spec(m.partition(".")[0])]
    for name in [*wanted, *modules]:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # a user's module may raise anything, SystemExit too
            return f"--preload {name}: {type(exc).__name__}: {exc}"
    gc.collect()
    gc.freeze()  # what it imported is never scanned again: no rank copies it on a collection
    return unsafe()


def unsafe() -> str | None:
    """Why forking now would be undefined, else None."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "CUDA was initialized while importing (a fork would break it)"
    tasks = len(os.listdir("/proc/self/task"))
    if threading.active_count() != 1 or tasks != 1:
        return (
            f"the imports started {tasks - 1} thread{'s' if tasks > 2 else ''}, and a fork keeps "
            "only one (OpenBLAS starts its pool unless OMP_NUM_THREADS=1, as gpulaunch sets "
            "for several ranks)"
        )
    return None


def serve(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Fork ranks until the watcher goes; returns only in a rank, with its request."""
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 22, MAX_FDS)
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)  # the watcher is gone
        request = json.loads(data)
        why = unsafe()
        pid = None if why else fork_rank()
        if pid == 0:
            return request, fds
        for fd in fds:
            os.close(fd)
        if why or pid is None:
            _send(sock, {"cold": why or "the fork failed"})
        else:
            _send(sock, {"pid": pid})


def fork_rank() -> int | None:
    """0 in the rank; its pid in the warm process (None: the fork failed). A middle process
    forks it and exits, so the rank goes to the watcher, a subreaper while it asks."""
    read_end, write_end = os.pipe()
    try:
        middle = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if middle == 0:  # the middle process
        os.close(read_end)
        try:
            pid = os.fork()
        except OSError:
            os._exit(1)
        if pid == 0:
            os.close(write_end)
            return 0
        os.write(write_end, b"%d" % pid)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        said = f.read()
    os.waitpid(middle, 0)
    return int(said) if said.isdigit() else None


def become(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the rank: wait at the gate, then run the script as `python -u SCRIPT` would."""
    sock.close()
    os.setpgid(0, 0)  # as base/procs.py: its own process group
    gate = arrange_fds(request["fds"], fds[1:], fds[0])
    set_cmdline(request["argv"])
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # at its gate as a cold rank: no handler yet
    try:
        opened = os.read(gate, 1) == b"x"
    except OSError:
        opened = False
    if not opened:
        os._exit(GATE_CLOSED)
    os.close(gate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as CPython starts
    if request["death_signal"]:
        ctypes.CDLL(None, use_errno=True).prctl(1, request["death_signal"], 0, 0, 0)
    if os.getppid() != request["watcher"]:
        os.write(2, b"gpulaunch: a warm rank was not handed to its watcher\n")
        os._exit(GATE_CLOSED)
    os.environ.clear()
    os.environ.update(request["env"])
    if os.getcwd() != request["cwd"]:
        os.chdir(request["cwd"])
    make_stdio()
    fresh_state()
    run(request["argv"])


def arrange_fds(targets: list[int], sources: list[int], gate: int) -> int:
    """Exactly `targets` (from `sources`) open, and the gate above them; returns the gate's."""
    top = max([2, *targets]) + 1
    moved = [fcntl.fcntl(src, fcntl.F_DUPFD_CLOEXEC, top + 1) for src in [*sources, gate]]
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in moved:
            try:
                os.close(int(name))
            except OSError:
                continue
    for target, source in zip([*targets, top], moved, strict=True):
        os.dup2(source, target, inheritable=target != top)
        os.close(source)
    return top


def set_cmdline(words: list[str]) -> None:
    """What `ps` shows: our argv's memory rewritten (the interpreter has its own copy)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # proc(5): arg_start, arg_end
    except (OSError, IndexError, ValueError):
        return
    room = end - start
    if room <= 1:
        return
    data = b"\0".join(os.fsencode(w) for w in words)[: room - 1]
    ctypes.memmove(start, data + b"\0" * (room - len(data)), room)


def make_stdio() -> None:
    """sys.stdin/stdout/stderr over the rank's fds, as CPython makes them at start-up."""
    unbuffered = bool(getattr(sys.__stdout__, "write_through", False))
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        like = getattr(sys, f"__{name}__")
        try:
            os.fstat(fd)
        except OSError:
            stream = None
        else:
            write = mode == "w"
            buffering = 0 if unbuffered and write else -1
            buf: Any = open(fd, mode + "b", buffering=buffering, closefd=False)
            raw = buf if buffering == 0 else buf.raw
            raw.name = f"<{name}>"
            line = not unbuffered and (raw.isatty() or fd == 2)
            stream = io.TextIOWrapper(
                buf,
                encoding=like.encoding if like else None,
                errors=like.errors if like else None,
                newline="\n",
                line_buffering=line,
                write_through=unbuffered,
            )
            stream.mode = mode  # type: ignore[misc]
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def fresh_state() -> None:
    """What each interpreter has of its own and a fork would share: random seeds (random
    reseeds itself at fork), numpy's global generator, multiprocessing's authkey."""
    numpy = sys.modules.get("numpy.random")
    if numpy is not None:
        try:
            numpy.seed()
        except Exception:  # noqa: BLE001 - a numpy without it: nothing shared to reseed
            pass
    process = sys.modules.get("multiprocessing.process")
    if process is not None:
        process.current_process().authkey = os.urandom(32)


def _fresh_main() -> types.ModuleType:
    main = types.ModuleType("__main__")
    main.__builtins__ = sys.modules["builtins"]  # type: ignore[attr-defined]
    main.__annotations__ = {}
    sys.modules["__main__"] = main
    return main


def run(argv: list[str]) -> None:
    """`python -u SCRIPT ARGS` or `python -u -m MODULE ARGS`: argv[2:] (after `python -u`)."""
    sys.orig_argv = list(argv)
    importlib.invalidate_caches()
    try:
        if argv[2] == "-m":
            sys.argv = ["-m", *argv[4:]]
            if not sys.flags.safe_path:
                sys.path[0] = os.getcwd()
            _fresh_main()
            import runpy

            runpy._run_module_as_main(argv[3], alter_argv=True)  # type: ignore[attr-defined]
        else:
            _run_script(argv[2], argv[3:])
    except SystemExit:
        raise  # the interpreter's own handling: its code, its message
    except KeyboardInterrupt as exc:
        exc.with_traceback(_user_frames(exc.__traceback__))  # what excepthook prints
        sys.excepthook(type(exc), exc, exc.__traceback__)
        _exit_by_sigint()
    except BaseException as exc:
        exc.with_traceback(_user_frames(exc.__traceback__))
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)


def _run_script(script: str, args: list[str]) -> None:
    sys.argv = [script, *args]
    path = os.path.abspath(script)
    if not sys.flags.safe_path:
        sys.path[0] = os.path.dirname(os.path.realpath(script))
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        print(
            f"{sys.orig_argv[0]}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}",
            file=sys.stderr,
        )
        sys.exit(2)
    main = _fresh_main()
    main.__file__ = path
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    code = compile(source, path, "exec", dont_inherit=True)
    exec(code, main.__dict__)  # noqa: S102 - it is the user's script, as `python` runs it


def _user_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback without our own frames: as a cold start's begins."""
    while tb is not None and tb.tb_frame.f_code.co_filename == _OURS:
        tb = tb.tb_next
    return tb


def _exit_by_sigint() -> None:
    """As CPython after an unhandled KeyboardInterrupt: finalize, then die of SIGINT."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001, S110 - as at exit: nothing more to say
            pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(128 + signal.SIGINT)


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


if __name__ == "__main__":
    main()
