"""The VM lab: a Debian 12 VM (qemu) for what the systemd box cannot prove
(cgroup controllers, real SSH logins, containers). See sdbox/vm/README.md."""

from sdbox.vm.image import Image, VMError, ensure
from sdbox.vm.machine import Machine

__all__ = ["Image", "Machine", "VMError", "ensure"]
