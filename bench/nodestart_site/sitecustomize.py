"""Issue 27's start profile: marks when every Python process of a node reaches each phase.

Put on PYTHONPATH with BENCH_TRACE_DIR set (bench/nodestart.py does both); nothing happens
otherwise. Each process appends `TIME PID EVENT DETAIL` lines (time.time(), comparable across
the processes of one machine) to BENCH_TRACE_DIR/PID. Nothing of gpulaunch's or torch's code
is changed: audit hooks (imports, forks, execs, spawns) and wrappers installed when the
module they wrap finishes loading (the rendezvous handler, the peer's JOINED message).
"""

import os
import sys
import time

_T0 = time.time()
_DIR = os.environ.get("BENCH_TRACE_DIR")


def _mark(event: str, detail: str = "") -> None:
    line = f"{time.time():.6f} {os.getpid()} {event} {detail}\n".encode()
    fd = os.open(os.path.join(_DIR, str(os.getpid())), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


_ALL_IMPORTS = bool(os.environ.get("BENCH_TRACE_ALL_IMPORTS"))  # every module's first import
_WATCHED_IMPORTS = {
    "torch",
    "gpulaunch.cli",
    "gpulaunch.start",
    "gpulaunch.multinode.peerlink",
    "gpulaunch.watcher.loop",
    "torch.distributed.run",
}


def _audit(event: str, args: tuple) -> None:  # type: ignore[type-arg]
    if event == "import":
        if args[0] in _WATCHED_IMPORTS or _ALL_IMPORTS:
            _WATCHED_IMPORTS.discard(args[0])
            _mark("import", args[0])
    elif event in ("os.fork", "os.posix_spawn", "os.exec", "subprocess.Popen"):
        argv = args[1] if event != "os.fork" and len(args) > 1 else ()
        try:
            words = [os.fsdecode(a) for a in list(argv)[:4]]
        except TypeError:
            words = []
        _mark(event, " ".join(w[:60] for w in words))


def _after_load(name: str, patch):  # type: ignore[no-untyped-def]
    """Run `patch(module)` once module `name` has finished loading."""
    from importlib.machinery import PathFinder  # (not importlib.abc: it imports pathlib & co.)

    class Finder:
        def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            real = spec.loader.exec_module

            def exec_module(module):  # type: ignore[no-untyped-def]
                real(module)
                patch(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())


def _patch_registry(mod) -> None:  # type: ignore[no-untyped-def]
    real = mod.get_rendezvous_handler

    def get_rendezvous_handler(params):  # type: ignore[no-untyped-def]
        _mark("rdzv.handler", "start (torch imported)")
        handler = real(params)
        _mark("rdzv.handler", "made (store served or connected)")
        nxt = handler.next_rendezvous

        def next_rendezvous(*a, **k):  # type: ignore[no-untyped-def]
            _mark("rdzv.next", "start")
            out = nxt(*a, **k)
            _mark("rdzv.next", "done")
            return out

        handler.next_rendezvous = next_rendezvous
        return handler

    mod.get_rendezvous_handler = get_rendezvous_handler


def _patch_protocol(mod) -> None:  # type: ignore[no-untyped-def]
    enc, dec = mod.encode, mod.decode

    def encode(kind, **body):  # type: ignore[no-untyped-def]
        if str(getattr(kind, "value", kind)) == "joined":
            _mark("peer.joined", "sent")
        return enc(kind, **body)

    def decode(line):  # type: ignore[no-untyped-def]
        kind, body = dec(line)
        if kind == "joined":
            _mark("watcher.joined", "received")
        return kind, body

    mod.encode, mod.decode = encode, decode


_OURS = any(
    w.endswith(("gpulaunch", "torchrun", "gpulaunch.multinode.peer")) for w in sys.orig_argv
)
if _DIR and _OURS:  # the launchers and the peer; the ranks stamp themselves
    _mark(
        "python",
        f"up (sitecustomize at +{(time.time() - _T0) * 1000:.1f} ms) "
        + f"ppid {os.getppid()} "
        + " ".join(a[:40] for a in sys.orig_argv[:4]),
    )
    sys.addaudithook(_audit)
    os.register_at_fork(after_in_child=lambda: _mark("forked", f"ppid {os.getppid()}"))
    _after_load("torch.distributed.elastic.rendezvous.registry", _patch_registry)
    _after_load("gpulaunch.base.protocol", _patch_protocol)
