"""The settings a unit template may not take away: what "any failure stops all" rests on.

The codec (`gpulaunch.units.codec`) accepts any setting systemd accepts on a scope or a
slice. Some of them would quietly defeat what gpulaunch promises (README, "The units of a
job"): when any rank fails or the watcher dies, every process of the job is stopped and no
unit is left behind. This module knows which unit is which and refuses, with the reason,
a rendered unit that would break that:

Both scopes (`rank.scope`, `watcher.scope`):

- `Slice=` must be set, to the job's own slice: the ranks slice for a rank (the watcher
  stops that slice to stop the gang), the job slice for the watcher (which the watcher's
  `PropagatesStopTo=` removes). Anywhere else a scope would outlive its job.
- `KillMode=` must be `control-group` (the default) or `mixed`: `process` and `none` leave
  a scope's other processes (dataloader workers, daemons) running when it is stopped.
- `SendSIGKILL=` must stay `yes` and `FinalKillSignal=` `SIGKILL`: otherwise a process
  that ignores SIGTERM outlives the stop.
- `TimeoutStopSec=` must not be `infinity` (unset means the manager's
  `DefaultTimeoutStopSec=`): the stop would wait forever for such a process.
- `CollectMode=inactive-or-failed` must be set: a scope whose stop timed out is "failed",
  and would stay in `systemctl --failed`.

`rank.scope`: `BindsTo=` and `After=` must name the watcher scope (systemd stops the rank
when the watcher goes away, however it dies), and `Before=` must not (an ordering cycle
makes systemd drop one of the two jobs).

`watcher.scope`: `PropagatesStopTo=` must name the job slice (the slice is removed when
the watcher ends; a slice never goes away by itself, docs/systemd-facts.md).

`anchor.service`: `Slice=` and `PropagatesStopTo=` must name the job slice (its end, the
watcher's end, removes the job; supervisor/anchor.py).

Every unit: `RefuseManualStop=yes` is refused (the watcher stops the ranks slice with
`StopUnit`, and `systemctl stop` of a job's slice must keep working).

Allowed because they do not break the promise: limits that end a unit (`RuntimeMaxSec=`,
`OOMPolicy=`, `ManagedOOM*=`, `MemoryMax=`) end a rank the way a crash does, and the watcher
stops the rest; `Delegate=` hands the subtree below the scope to its processes, but the
subtree stays inside the scope's cgroup and systemd kills all of it on stop;
`KillSignal=` changes only the first signal; extra dependencies and `OnFailure=` units
are the template author's own, run by the same manager with the same rights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpulaunch.errors import UnitFileError
from gpulaunch.units.codec import INFINITY, Property

_HINT = (
    "gpulaunch relies on it so that any failure stops every rank and nothing is left behind "
    '(README, "Unit templates")'
)
_SIGKILL = 9


@dataclass(frozen=True)
class JobUnitNames:
    """The units of the job a template is rendered for, as the templates were told."""

    job_slice: str
    ranks_slice: str
    watcher_scope: str


@dataclass(frozen=True)
class _Rule:
    """One guarantee: `problem` returns why the unit's value of `key` breaks it, or None.

    `value` is the property's value, or None when the unit does not set it.
    """

    key: str
    section: str
    problem: Callable[[object, JobUnitNames], str | None]
    dbus_name: str = ""


def _slice(
    role: str, expected: Callable[[JobUnitNames], str], what: str, kind: str = "scope"
) -> _Rule:
    def problem(value: object, names: JobUnitNames) -> str | None:
        want = expected(names)
        if value == want:
            return None
        now = "Slice= is missing" if value is None else f"Slice={value} is not the job's"
        return (
            f"{now}: the {role} {kind} must be in {want} ({what}), or it outlives "
            f"its job; write Slice={{{{ {'ranks_slice' if role == 'rank' else 'job_slice'} }}}}"
        )

    return _Rule("Slice", kind.capitalize(), problem)


def _names(key: str, expected: Callable[[JobUnitNames], str], variable: str, why: str) -> _Rule:
    def problem(value: object, names: JobUnitNames) -> str | None:
        want = expected(names)
        if isinstance(value, list) and want in value:
            return None
        return f"{key}= must name {want} ({why}); write {key}={{{{ {variable} }}}}"

    return _Rule(key, "Unit", problem)


def _kill_mode(value: object, names: JobUnitNames) -> str | None:
    if value in (None, "control-group", "mixed"):
        return None
    return (
        f"KillMode={value} would leave processes of the scope running when it is stopped; "
        "use control-group (the default) or mixed"
    )


def _send_sigkill(value: object, names: JobUnitNames) -> str | None:
    if value is not False:
        return None
    return "SendSIGKILL=no lets a process that ignores SIGTERM outlive the stop; remove it"


def _final_kill_signal(value: object, names: JobUnitNames) -> str | None:
    if value in (None, _SIGKILL):
        return None
    return (
        f"FinalKillSignal= must stay SIGKILL (it is what SendSIGKILL= sends, not {value}): "
        "a process that catches it outlives the stop; remove it"
    )


def _timeout_stop(value: object, names: JobUnitNames) -> str | None:
    if value != INFINITY:
        return None
    return (
        "TimeoutStopSec=infinity waits forever for a process that ignores SIGTERM; "
        "use a finite time, e.g. TimeoutStopSec={{ grace_sec | timespan }}"
    )


def _collect_mode(value: object, names: JobUnitNames) -> str | None:
    if value == "inactive-or-failed":
        return None
    now = "CollectMode= is missing" if value is None else f"CollectMode={value}"
    return (
        f"{now}: a scope whose stop timed out would stay in systemctl --failed; "
        "write CollectMode=inactive-or-failed"
    )


def _not_before_watcher(value: object, names: JobUnitNames) -> str | None:
    if not isinstance(value, list) or names.watcher_scope not in value:
        return None
    return (
        f"Before={names.watcher_scope} contradicts After= the watcher scope; systemd would "
        "break the ordering cycle by dropping a job; remove it"
    )


def _refuse_manual_stop(value: object, names: JobUnitNames) -> str | None:
    if value is not True:
        return None
    return (
        "RefuseManualStop=yes would refuse the watcher's (and systemctl's) stop of the job; "
        "remove it"
    )


_SCOPE_RULES = (
    _Rule("KillMode", "Scope", _kill_mode),
    _Rule("SendSIGKILL", "Scope", _send_sigkill),
    _Rule("FinalKillSignal", "Scope", _final_kill_signal),
    _Rule("TimeoutStopSec", "Scope", _timeout_stop, "TimeoutStopUSec"),
    _Rule("CollectMode", "Unit", _collect_mode),
)
_EVERY_UNIT = (_Rule("RefuseManualStop", "Unit", _refuse_manual_stop),)

RULES: dict[str, tuple[_Rule, ...]] = {
    "rank.scope": (
        _slice("rank", lambda n: n.ranks_slice, "the watcher stops it to stop all ranks"),
        _names(
            "BindsTo",
            lambda n: n.watcher_scope,
            "watcher_scope",
            "systemd stops the rank when the watcher goes away",
        ),
        _names(
            "After",
            lambda n: n.watcher_scope,
            "watcher_scope",
            "the rank stops before the watcher's scope is gone",
        ),
        _Rule("Before", "Unit", _not_before_watcher),
        *_SCOPE_RULES,
        *_EVERY_UNIT,
    ),
    "watcher.scope": (
        _slice("watcher", lambda n: n.job_slice, "its stop removes the job slice"),
        _names(
            "PropagatesStopTo",
            lambda n: n.job_slice,
            "job_slice",
            "when the watcher ends, systemd stops and removes the job slice",
        ),
        *_SCOPE_RULES,
        *_EVERY_UNIT,
    ),
    "job.slice": _EVERY_UNIT,
    "ranks.slice": _EVERY_UNIT,
    "anchor.service": (
        _slice("anchor", lambda n: n.job_slice, "the job slice goes when it ends", "service"),
        _names(
            "PropagatesStopTo",
            lambda n: n.job_slice,
            "job_slice",
            "when the watcher dies, even before its scope held it, systemd stops the job slice",
        ),
        _Rule("CollectMode", "Unit", _collect_mode),
        *_EVERY_UNIT,
    ),
    "launch.service": (_Rule("CollectMode", "Unit", _collect_mode), *_EVERY_UNIT),
    "tie.service": (_Rule("CollectMode", "Unit", _collect_mode), *_EVERY_UNIT),
}


def _line_of(text: str, key: str, section: str) -> int:
    """The rendered line that last sets `key`, else the header of `section`, else 1."""
    lines = text.splitlines()
    for number in range(len(lines), 0, -1):
        name, equals, _ = lines[number - 1].strip().partition("=")
        if equals and name.strip() == key:
            return number
    for number, line in enumerate(lines, 1):
        if line.strip() == f"[{section}]":
            return number
    return 1


def check_unit(
    template: str,
    properties: tuple[Property, ...],
    text: str,
    source: str,
    names: JobUnitNames,
) -> None:
    """Raise `UnitFileError` if the unit rendered from `template` breaks a guarantee.

    `properties` are the codec's conversion of `text`; `source` names the text in the
    message (its line is the line of `text` that sets the setting, or its section header
    when the setting is missing).
    """
    values = {p.name: p.value for p in properties}
    for rule in RULES[template]:
        problem = rule.problem(values.get(rule.dbus_name or rule.key), names)
        if problem is not None:
            line = _line_of(text, rule.key, rule.section)
            raise UnitFileError(
                f"{source}:{line}: {problem}", _HINT, source=source, line=line, setting=rule.key
            )
