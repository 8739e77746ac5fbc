"""Errors that reach the user as one line plus a hint.

Each class carries the process exit code that `gpulaunch` documents for it
(README, "Exit codes"). The codes follow sysexits.h where one fits, so they
stay apart from the small codes training scripts usually exit with.

Exit codes:
  0..255  `start`, `wait`: the job's status (0, the cause rank's exit code, 128+N
          for signal N; 130/143/129 when the watcher was interrupted)
  2       bad command line or input (unknown option, missing script, ...)
  3       unknown job (with or without a bus); `signal` of a job that ended
  68      a multi-node job could not join its other nodes (the rendezvous failed)
  69      something this machine must provide is missing (a systemd manager, journalctl, ...);
          `stacks`: not one rank's stacks could be read; `--gpus auto:N`: too few free
          GPUs or no lease store; a GPU the health gate refuses (gpulaunch/leases/);
          `--metrics-listen`: its address cannot be had (a port in use)
  70      internal error (a bug: rerun with --debug and report it)
  71      systemd, or a job's watcher on the bus, refused or failed an operation (or what
          answers at a job's name is not a gpulaunch job)
  73      a job with this id is already running
  75      multi-node: the job stopped because another node was lost (its watcher died,
          it stopped answering, or the store it served went away)
  76      the job's watcher went away without saying how the job ended (`wait`, `stop`;
          `status`, `signal` of a record file whose watcher is gone)
  77      permission denied by systemd or the bus
  78      bad unit template or setting; a rank's exit 78 (EX_CONFIG) is never restarted
  79      `start --preempt-grace`: the job was preempted (for a scheduler to requeue it:
          Slurm's `--requeue` with `RequeueExit=79`; docs/recovery.md)
  80      `start --max-restarts`: a crash loop (--crash-loop attempts in a row failed the
          same way, none of them running --progress-after)
  81      `start --max-requeues` in a Slurm job: "requeue me": --max-restarts were spent on a
          failure that may be retried, and the job was requeued fewer than N times (Slurm's
          `RequeueExit=79,81`, or the batch script's `scontrol requeue`: examples/slurm/)
  85      `start` in a Slurm job: its time limit (`--time`) ended it; not a failure (Slurm's
          scancel gives 143 and a requeue 79, also with --preempt-grace; schedulers/slurm.py)
  124     `start --hang-timeout`: the job hung (no rank printed or used CPU for that long)
  143     `start`: the job was stopped from outside (`systemctl stop`) while its units were made
"""

from __future__ import annotations


class GpulaunchError(Exception):
    """An expected problem: a one-line message saying what is wrong, and a hint."""

    exit_code: int = 70  # EX_SOFTWARE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(GpulaunchError):
    """The command line or its input is wrong (also: the script does not exist)."""

    exit_code = 2


class UnavailableError(GpulaunchError):
    """Something this machine must provide for the command is missing or unreadable."""

    exit_code = 69  # EX_UNAVAILABLE


class NoSystemdError(UnavailableError):
    """No systemd manager can be reached on the bus we need."""

    exit_code = 69  # EX_UNAVAILABLE


class AccessDeniedError(GpulaunchError):
    """systemd or the bus refused us."""

    exit_code = 77  # EX_NOPERM


class JobExistsError(GpulaunchError):
    """A job with this id is already running."""

    exit_code = 73  # EX_CANTCREAT


class UnknownJobError(GpulaunchError):
    """No job with this id exists (running or recorded)."""

    exit_code = 3


class JobLostError(GpulaunchError):
    """A job's watcher went away without saying how the job ended (it was killed)."""

    exit_code = 76  # EX_PROTOCOL


class TemplateError(GpulaunchError):
    """A unit template or one of its settings is wrong."""

    exit_code = 78  # EX_CONFIG


class UnitFileError(TemplateError):
    """A setting in rendered unit-file text is wrong; knows where (source file and line)."""

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        source: str,
        line: int,
        setting: str | None = None,
    ) -> None:
        super().__init__(message, hint)
        self.source = source
        self.line = line
        self.setting = setting


class SystemdError(GpulaunchError):
    """systemd refused or failed an operation for a reason not covered above."""

    exit_code = 71  # EX_OSERR


class StoppedWhileStartingError(GpulaunchError):
    """The job's slice was stopped from outside (`systemctl stop`) while its units were made.

    An interrupt, not a failure: the status is that of a SIGTERM.
    """

    exit_code = 143


class SupervisorError(GpulaunchError):
    """The direct supervisor could not make or use the job's cgroups."""

    exit_code = 71  # EX_OSERR, as systemd's failures


class WatcherCallError(GpulaunchError):
    """A job's watcher answered a call on the bus with an error we did not expect."""

    exit_code = 71  # EX_OSERR, as systemd's failures


class NodeLinkError(GpulaunchError):
    """A multi-node job could not join its other nodes (the rendezvous failed)."""

    exit_code = 68  # EX_NOHOST
