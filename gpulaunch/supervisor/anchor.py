"""The job's anchor: a process systemd itself starts, which lives as long as the watcher.

Why it exists (issue 13, item 4): a scope is started for processes someone
else forked, with `PIDs=`. If the watcher is SIGKILLed after asking for its
scope but before systemd moved it there, the watcher is a zombie when the
start job runs: systemd "moves" it without error, and the scope stays
`active (running)` with an empty cgroup, for good, and the job slice with it.
No property of a scope or a slice removes that (an empty cgroup that never
was populated sends no event; `RuntimeMaxSec=` of a scope cannot be changed
once it runs, systemd 252).

So the first call of a job creates, at once (one `StartTransientUnit`, the job
slice as its auxiliary unit): the job slice and `gpulaunch-<JOB>-anchor.service`
in it, a service whose process systemd forks (so it is never empty), which
waits for the watcher's pid to end and then exits. The service carries
`PropagatesStopTo=` the job slice: when it ends, systemd stops the job slice
and everything in it (the watcher scope, empty or not, and the ranks). A
watcher killed at any instant leaves either nothing (killed before that call)
or an anchor that sees it gone and takes the job down. Later units are created
inside the slice and go with it.

The service comes from its template, units/anchor.service, rendered for the watcher's pid
(`JobUnits.anchor`, gpulaunch/units/job.py, which also holds the program it runs).
"""

from __future__ import annotations
