"""Where the files gpulaunch ships but does not run are: unit templates and packaging.

In the repository they are at the top level, `units/` (the unit templates, what gpulaunch
asks systemd for) and `packaging/` (what a distribution or an admin installs: the D-Bus
policy, the journald drop-in, ...), where an admin looks for them. A wheel carries them
inside the package, as `gpulaunch/_shipped/units/` and `gpulaunch/_shipped/packaging/`
(pyproject.toml, hatch's `force-include`), since an installed package has no repository
beside it. This module is the one place that knows both.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
INSTALLED = _PACKAGE / "_shipped"  # in a wheel's installation


def _shipped(name: str) -> Path:
    installed = INSTALLED / name
    if installed.is_dir():
        return installed
    return _PACKAGE.parent / name  # a source tree, or an editable installation of one


def units_dir() -> Path:
    """The built-in unit templates: `units/` of the repository, package data in a wheel."""
    return _shipped("units")


def packaging_dir() -> Path:
    """What `gpulaunch setup` installs: `packaging/` of the repository, package data in a
    wheel."""
    return _shipped("packaging")
