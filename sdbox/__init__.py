"""sdbox: a throwaway systemd for gpulaunch's tests and demo (not part of the wheel).

    with Box(binds=[repo]) as box:          # boots in ~0.25 s, torn down on exit
        box.run(["systemctl", "is-system-running"], capture_output=True)

`python -m sdbox run -- CMD` runs CMD under systemd (the host's, else a box's);
`python -m sdbox shell` opens a shell in a box. Root only. See sdbox/box.py.
"""

from sdbox.box import Box, BoxError, HostSystemd, host_systemd_running

__all__ = ["Box", "BoxError", "HostSystemd", "host_systemd_running"]
