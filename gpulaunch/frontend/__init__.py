"""The front end: `gpulaunch start` from where the user manager cannot adopt it.

An ordinary user's login shell lives in `user-UID.slice/session-N.scope`, a
cgroup of root's: the user manager cannot move processes out of it, so a
watcher started there could not put itself or its ranks into scopes. There the
command the user typed stays a thin front end (`run.py`) and the watcher runs as
a transient service that the user manager spawns itself (`unit.py`), with the
front end's stdin, stdout and stderr; `need.py` decides, `peerbus.py` speaks to
the manager's private socket, `argv.py` carries the user's arguments through
systemd whatever bytes they are, and `tether.py` is the watcher's own watch on its
front end. docs/architecture.md, "The front end", has the whole story.
"""
