"""What the README's rules expect of one soak job, and whether what happened matches.

Pure logic: `expected(plan, seen)` lists the acceptable ends, `judge(plan, seen)` says
which failure columns a job counts in, with the reasons.

The rules (README, "Exit status"; docs/dbus.md, the record):

- every rank exits 0: 0, cause `succeeded`;
- a rank exits with code c: c; killed by SIGKILL/SIGSEGV (its own): 137/139; cause
  `rank-failed`, that rank;
- SIGKILL to the watcher: it dies of it (the shell's 137) and writes no record: none is
  expected, so a missing one is never counted; what must hold is that nothing is left;
- SIGTERM/SIGINT to the watcher: 143/130, cause `interrupted`; unless the rank's failure
  came first (it did fail: its `fault` stamp exists), then the rank's status. During
  start-up also: the process died of the signal before gpulaunch took it over (the
  shell's 143/130, nothing made, no report, no record), 130 from `gpulaunch`'s quiet ^C
  during its imports (no report, no record), 143 from its SIGTERM handler before the
  watcher's own (one line, "stopped by SIGTERM before the job started": nothing made, no
  report, no record may exist), or a clean start failure (71, one line);
  never 70 and never a traceback, but for one: a SIGINT in the first milliseconds, while
  the Python interpreter and the console script start and before gpulaunch's first
  line runs, ends with Python's own KeyboardInterrupt (exit 1 or the shell's 130, no
  report, no record). No Python program can prevent that; `_before_our_code` tells it
  from a traceback of gpulaunch's (any frame of gpulaunch's code beyond its entry
  module's first line is one);
- `systemctl stop` of the job slice, `gpulaunch stop`: 143, cause `interrupted`;
  `gpulaunch stop` itself exits 0 (docs/dbus.md);
- a restart of dbus or journald: the job's own end, as if nothing had happened.

The kinds added for issue 22 (what its items 1-3 and the README expect):

- SIGKILL to an ordinary user's front end while the job runs: the front end dies of it
  (the shell's 137); systemd stops the watcher's service, and the watcher ends the job
  as for a SIGTERM: its report (on the same terminal) and its record say 143,
  `interrupted`;
- the user's manager stopped, the user logged out (`loginctl terminate-user`): an
  interruption, 143, reported and recorded (the journal is system-wide);
- the user manager's daemon-reexec, in start-up or while the job runs: the job's own end;
- SIGKILL to a direct watcher whose ranks have children: it dies of it and writes no
  record; nothing of the job is left (no process, no job cgroup: the same id runs again);
- `systemctl stop` of the job slice within 0.15 s of its units being made: 143, with the
  report and record of an interruption, or one line (StoppedWhileStartingError) and a
  record of 143; never 141, 70 or 71.

The kinds added for issue 35 (items 8, 11 and 5):

- restart-sigterm: `--max-restarts 2`, a rank exits with a code that restarts, the others
  take 1.5-3 s to stop, and the watcher gets SIGTERM while that restart's gang stop runs:
  the interrupt wins, 143 and cause `interrupted` (with `--preempt-grace`: 79, cause
  `preempted`), reported and recorded; nothing restarts ("restarting all ranks" is never
  said), the terminal says once why not ("not restarting: the job was interrupted while
  its ranks stopped"), and with `--preempt-grace` names the signal ("SIGTERM: preempted
  while the ranks stop");
- direct-pkill: the direct keeper and its watcher SIGKILLed together while ranks with
  children run: the keeper dies of it, no record is required; nothing of the job is left
  (the sentinel ends the job's cgroup) and `gpulaunch status` does not say it runs;
- direct-stop: `gpulaunch stop JOB` of a direct job while it runs: 143, `interrupted`,
  reported and recorded, and `gpulaunch stop` itself exits 0.

A record is required wherever a report was printed (the watcher writes the record
first) and wherever an end is expected with a report; its status, cause and cause rank
must be the report's. "Missing record" counts the jobs whose required record is not in
the journal.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from bench.soak.plan import RESTARTS, WATCHER_SIGNALS, Fault, JobPlan, Phase

START_FAILED = 71  # README: systemd refused or failed an operation
PREEMPTED = 79  # README: preempted (--preempt-grace), requeue it
# gpulaunch/__main__.py's line for a stop before the watcher's handlers (the same text)
STOPPED_BEFORE_START = "gpulaunch: stopped by {name} before the job started (nothing was made)"
# A watcher killed by SIGKILL writes no record: none is required, and none is looked at.
SIGKILLED_WATCHER = (
    Fault.WATCHER_SIGKILL,
    Fault.DIRECT_SIGKILL_CGROUP,
    Fault.DIRECT_SIGKILL_PGROUP,
    Fault.DIRECT_PKILL,
)
STOPS = (Fault.SLICE_STOP, Fault.GPULAUNCH_STOP, Fault.DIRECT_STOP)
STOP_COMMANDS = (Fault.GPULAUNCH_STOP, Fault.DIRECT_STOP)  # `gpulaunch stop` must exit 0
# gpulaunch/recovery/policy.py's and watcher/notices.py's lines (restart-sigterm)
RESTARTING = "restarting all ranks"
NOT_RESTARTING = "not restarting: the job was interrupted while its ranks stopped"
PREEMPTED_WHILE_STOPPING = "SIGTERM: preempted while the ranks stop"


@dataclass(frozen=True)
class End:
    """How a job ended, as its report or its journal record says."""

    status: int
    cause: str  # succeeded, rank-failed, interrupted, start-failed, ...
    rank: int | None  # the cause rank


@dataclass(frozen=True)
class Seen:
    """What the soak saw of one job."""

    returncode: int | None  # Popen's: -N when a signal killed it; None: it hung (we killed it)
    stderr: str
    headline: End | None  # from the report on stderr
    record: End | None  # from the journal
    leaked_units: tuple[str, ...]
    leaked_procs: int
    acted: bool  # the outside action was done while the launcher ran
    action_rc: int | None  # exit status of the action's command (systemctl, gpulaunch stop)
    rank_faulted: bool  # the failing rank did its fault (stamped `fault`)
    # A direct job: the state `gpulaunch status` gives after its end (its record file);
    # None where not asked.
    state_after: str | None = None


@dataclass(frozen=True)
class Expect:
    """One acceptable end: the exit status, the report's cause (None: no report) and record."""

    status: int
    cause: str | None
    rank: int | None = None
    record: bool = True  # required (else: there must be none... or it is not looked at)
    # The report's and record's status where the launcher's own differs (a front end
    # SIGKILLed: its watcher reports 143); None: the same as `status`.
    report_status: int | None = None
    # A line stderr must have instead of a report; then no record may exist.
    line: str | None = None

    @property
    def end(self) -> End | None:
        """The report's end this expects (None: no report)."""
        if self.cause is None:
            return None
        status = self.status if self.report_status is None else self.report_status
        return End(status, self.cause, self.rank)


@dataclass(frozen=True)
class Verdict:
    wrong_status: bool = False
    wrong_report: bool = False  # the report's or the record's cause/status is not the rule's
    leaked_units: bool = False
    leaked_procs: bool = False
    missing_record: bool = False
    hang: bool = False
    reasons: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return any(
            (
                self.wrong_status,
                self.wrong_report,
                self.leaked_units,
                self.leaked_procs,
                self.missing_record,
                self.hang,
            )
        )


_HEADLINE = re.compile(
    r"^gpulaunch: job (?P<job>.*?) (?:(?P<ok>succeeded) \(|(?P<preempted>preempted) \(status "
    r"(?P<s4>\d+):|(?P<stop>stopped by) .*\(status "
    r"(?P<s1>\d+)\)$|failed: rank (?P<rank>\d+) .*\(status (?P<s2>\d+)\)$|(?P<start>failed to "
    r"start) \(status (?P<s3>\d+)\)$)",
    re.MULTILINE,
)


def parse_headline(job: str, stderr: str) -> End | None:
    """The report's headline (report.py's `headline`) for `job`, the last one; None if none."""
    found = None
    for m in _HEADLINE.finditer(stderr):
        if m["job"] != job:
            continue
        if m["ok"]:
            found = End(0, "succeeded", None)
        elif m["preempted"]:
            found = End(int(m["s4"]), "preempted", None)
        elif m["stop"]:
            found = End(int(m["s1"]), "interrupted", None)
        elif m["rank"] is not None:
            found = End(int(m["s2"]), "rank-failed", int(m["rank"]))
        else:
            found = End(int(m["s3"]), "start-failed", None)
    return found


def ranks_end(plan: JobPlan) -> Expect:
    """The end the ranks make by themselves."""
    if plan.rank_fault == "none":
        return Expect(0, "succeeded")
    status = {"exit": plan.code, "sigkill": 128 + 9, "sigsegv": 128 + 11}[plan.rank_fault]
    return Expect(status, "rank-failed", plan.fault_rank)


def expected(plan: JobPlan, seen: Seen) -> list[Expect]:
    """Every end the README allows for this plan and what happened around it."""
    own = ranks_end(plan)
    if plan.fault is Fault.SUCCESS or plan.fault in RESTARTS or plan.phase is None:
        return [own]
    if not seen.acted:  # the launcher ended before the action: the ranks' own end
        return [own]
    if plan.fault is Fault.USER_MANAGER_REEXEC:
        return [own]
    if plan.fault is Fault.FRONTEND_SIGKILL:
        return [Expect(-signal.SIGKILL, "interrupted", report_status=128 + signal.SIGTERM)]
    if plan.fault in (Fault.USER_MANAGER_STOP, Fault.LOGOUT):
        return [Expect(128 + signal.SIGTERM, "interrupted")]
    if plan.fault is Fault.RESTART_SIGTERM and plan.preempt:
        return [Expect(PREEMPTED, "preempted")]
    if plan.fault is Fault.RESTART_SIGTERM:
        return [Expect(128 + signal.SIGTERM, "interrupted")]
    if plan.fault in SIGKILLED_WATCHER and plan.fault is not Fault.WATCHER_SIGKILL:
        return [Expect(-signal.SIGKILL, None, record=False)]
    if plan.fault is Fault.STOP_AT_START:
        return [Expect(128 + signal.SIGTERM, "interrupted"), Expect(128 + signal.SIGTERM, None)]
    if plan.fault is Fault.WATCHER_SIGKILL:
        return [Expect(-signal.SIGKILL, None, record=False)]
    if plan.fault in STOPS:
        return [Expect(128 + signal.SIGTERM, "interrupted")]
    signum = WATCHER_SIGNALS[plan.fault]
    ends = [Expect(128 + signum, "interrupted")]
    if seen.rank_faulted:
        ends.append(own)
    if plan.phase is Phase.START_UP:
        ends += [
            Expect(-signum, None, record=False),  # before gpulaunch took the signal over
            # taken over (gpulaunch/__main__.py), before the watcher's own handler and so
            # before anything of the job: one line
            Expect(128 + signum, None, record=False, line=_before_start(signum)),
            Expect(START_FAILED, "start-failed"),  # a start that failed cleanly, reported
            Expect(START_FAILED, None, record=False),  # ... or one line before any unit
        ]
        if signum == signal.SIGINT:
            ends.append(Expect(128 + signum, None, record=False))  # ^C during the imports
    return ends


def _before_start(signum: int) -> str | None:
    """The line of a stop before the job started (None for SIGINT: a quiet ^C)."""
    if signum == signal.SIGINT:
        return None
    return STOPPED_BEFORE_START.format(name=signal.Signals(signum).name)


def _matches(e: Expect, seen: Seen) -> bool:
    if seen.returncode != e.status:
        return False
    if e.line is not None and e.line not in seen.stderr.splitlines():
        return False
    return seen.headline == e.end


def judge(plan: JobPlan, seen: Seen) -> Verdict:
    reasons: list[str] = []
    v = dict(
        leaked_units=bool(seen.leaked_units),
        leaked_procs=seen.leaked_procs > 0,
        hang=seen.returncode is None,
    )
    if seen.leaked_units:
        reasons.append("units left: " + " ".join(seen.leaked_units))
    if seen.leaked_procs:
        reasons.append(f"{seen.leaked_procs} processes of the job left")
    if seen.returncode is None:
        reasons.append("did not end within the hang bound (killed)")
        return Verdict(**v, reasons=tuple(reasons))
    if seen.state_after in ("running", "starting", "stopping"):  # issue 22, item 5
        v["wrong_report"] = True
        reasons.append(f"`gpulaunch status` says {seen.state_after} after the watcher died")
    if _before_our_code(plan, seen):  # the signal won: nothing made, nothing reported
        return Verdict(**v, reasons=tuple(reasons))
    if _own_traceback(seen.stderr):
        v["wrong_report"] = True
        reasons.append("a traceback or 'internal error' on stderr")
    if plan.fault is Fault.RESTART_SIGTERM and seen.acted:
        for why in _restart_lines(plan, seen.stderr):
            v["wrong_report"] = True
            reasons.append(why)
    if plan.fault in STOP_COMMANDS and seen.acted and seen.action_rc != 0:
        v["wrong_status"] = True
        reasons.append(f"`gpulaunch stop` exited {seen.action_rc}, not 0")
    ends = expected(plan, seen)
    match = next((e for e in ends if _matches(e, seen)), None)
    if match is None:
        statuses = sorted({e.status for e in ends})
        if seen.returncode not in statuses:
            v["wrong_status"] = True
            reasons.append(f"exit {seen.returncode}, expected one of {statuses}")
        else:
            v["wrong_report"] = True
            reasons.append(f"report {_show(seen.headline)} for exit {seen.returncode}")
    # Required after a report, by the end that matched, or (no end matched) by every end
    # the rules allow: then a wrong end without a record is missing one too.
    needed_by = [match] if match is not None else ends
    needs_record = seen.headline is not None or all(e.record for e in needed_by)
    if match is not None and match.line is not None and seen.record is not None:
        v["wrong_report"] = True  # nothing was started: nothing may be recorded
        reasons.append(f"record {_show(seen.record)} after {match.line!r}")
    elif plan.fault not in SIGKILLED_WATCHER:  # (a record there must say what happened)
        status = seen.returncode
        if match is not None and match.report_status is not None:
            status = match.report_status
        if seen.record is None:
            if needs_record:
                v["missing_record"] = True
                reasons.append("no journal record")
        elif seen.headline is not None and seen.record != seen.headline:
            v["wrong_report"] = True
            reasons.append(f"record {_show(seen.record)} but report {_show(seen.headline)}")
        elif seen.record.status != status:
            v["wrong_report"] = True
            reasons.append(f"record {_show(seen.record)} but exit {seen.returncode}")
    return Verdict(**v, reasons=tuple(reasons))


_RANK_LINE = re.compile(r"^\[\s*\d+\] ")  # gpulaunch/logs/output.py's prefix of a rank's line


def _own_traceback(stderr: str) -> bool:
    """A traceback or an internal error of gpulaunch's own, not one a rank printed: since
    SIGINT reaches the ranks (issue 35, item 4), an interrupted Python rank prints its
    KeyboardInterrupt, prefixed like all its lines (the report indents the error it quotes)."""
    own = [line for line in stderr.splitlines() if not _RANK_LINE.match(line)]
    return any(
        line.startswith("Traceback (most recent call last)") or "internal error" in line
        for line in own
    )


def _restart_lines(plan: JobPlan, stderr: str) -> list[str]:
    """What is wrong with the terminal's lines of an interrupted restart (restart-sigterm)."""
    wrong = []
    if RESTARTING in stderr:
        wrong.append(f"{RESTARTING!r} after the SIGTERM during the gang stop")
    if stderr.count(NOT_RESTARTING) != 1:
        wrong.append(f"{NOT_RESTARTING!r} said {stderr.count(NOT_RESTARTING)} times, not once")
    if plan.preempt and PREEMPTED_WHILE_STOPPING not in stderr:
        wrong.append(f"no {PREEMPTED_WHILE_STOPPING!r}")
    if not plan.preempt and "stopped by SIGTERM (status 143)" not in stderr:
        wrong.append("the report does not name SIGTERM")
    return wrong


_FRAME = re.compile(r'^  File "([^"]+)", line (\d+)', re.M)


def _before_our_code(plan: JobPlan, seen: Seen) -> bool:
    """A start-up SIGINT that Python's own KeyboardInterrupt took before gpulaunch's code.

    Every frame is the interpreter's (frozen importlib, the standard library), the
    console script's stub, or the first lines of gpulaunch/__main__.py (its `import
    signal`, before the handler it installs); and nothing was made or reported.
    """
    if plan.fault is not Fault.WATCHER_SIGINT or plan.phase is not Phase.START_UP:
        return False
    if not seen.stderr.rstrip().endswith("KeyboardInterrupt"):
        return False
    if seen.headline is not None or seen.record is not None or seen.returncode not in (1, -2):
        return False
    frames = _FRAME.findall(seen.stderr)
    if not frames:
        return False
    for path, line in frames:
        if path.endswith("gpulaunch/__main__.py") and int(line) <= ENTRY_LINES:
            continue
        if path.endswith("/bin/gpulaunch") or path.startswith("<frozen"):
            continue
        if "/gpulaunch/" in path or "site-packages" in path:
            return False  # gpulaunch's code (or its dependencies') ran: a real traceback
    return True


ENTRY_LINES = 36  # gpulaunch/__main__.py up to the line that installs its quiet ^C


def _show(end: End | None) -> str:
    if end is None:
        return "none"
    rank = f" rank {end.rank}" if end.rank is not None else ""
    return f"{end.cause}{rank} status {end.status}"
