"""The front end's death tie where there is no user bus (issue 29): a service systemd forks.

With a user bus, the watcher's service is `Type=dbus` with `BusName=` a name
the front end owns, and the bus daemon's release of that name stops it. On the
user manager's private socket there is no bus daemon and no name (frontend/
userbus.py). The tie is then what the job's anchor is for the watcher
(supervisor/anchor.py): `gpulaunch-<JOB>-tie.service`, created in the same
call as the watcher's service (an auxiliary unit it `Wants=`), whose process
systemd forks and which waits on a pidfd of the front end (verified by its
start time against pid reuse) and exits when the front end ends, however it
ended. Its `PropagatesStopTo=` the watcher's service: systemd then stops that
service as it would on the bus name's release (SIGTERM to the watcher, SIGKILL
after `TimeoutStopSec=`). `BindsTo=` the watcher's service ends the tie with the
job. No code of ours needs to run for either. A front end already gone when the
tie starts is seen at once (the pid is gone or is another process).
"""

from __future__ import annotations

from gpulaunch.frontend.unit import Prop
from gpulaunch.units.job import ANCHOR_PROGRAM as PROGRAM
from gpulaunch.units.job import start_time
from gpulaunch.units.names import PREFIX, ROOT_SLICE, UnitNames


def tie_name(names: UnitNames) -> str:
    return f"{PREFIX}-{names.component}-tie.service"


def tie_properties(names: UnitNames, service: str, python: str, frontend_pid: int) -> list[Prop]:
    """The tie's properties: it waits for `frontend_pid` and its end stops `service`."""
    argv = [python, "-I", "-S", "-c", PROGRAM, str(frontend_pid), start_time(frontend_pid)]
    return [
        Prop("Description", "s", f"gpulaunch job {names.job}: ties {service} to its front end"),
        Prop("Slice", "s", ROOT_SLICE),
        Prop("ExecStart", "a(sasb)", [(python, argv, False)]),
        Prop("WorkingDirectory", "s", "/"),
        Prop("StandardInput", "s", "null"),
        Prop("StandardOutput", "s", "null"),
        Prop("StandardError", "s", "journal"),
        Prop("PropagatesStopTo", "as", [service]),
        Prop("BindsTo", "as", [service]),
        Prop("CollectMode", "s", "inactive-or-failed"),
    ]
