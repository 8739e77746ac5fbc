"""The anchor service and the front end's service come from their templates (units/): the
properties are exactly the ones the Python code built before (issue 24, point 5), and every
value, however odd, survives the unit-file text: the text the codec reads back is what the
template was given.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulaunch import cli
from gpulaunch.errors import UnitFileError
from gpulaunch.frontend.unit import environment, launch_setup, service_properties
from gpulaunch.model import JobSpec
from gpulaunch.start import plan
from gpulaunch.units.codec import exec_words, parse_unit
from gpulaunch.units.definitions import JobUnits
from gpulaunch.units.job import ANCHOR_PROGRAM, start_time
from gpulaunch.units.templates import systemd_word

INF = 2**64 - 1
# Every character class a command line or an environment may hold.
ODD = [
    "a b", "'q\"", "\\", "$HOME", "${X}", "%h", "%%", "\n", "x\ty", "-", ";", "",
    " lead", "trail ", "é ü ☃", "\x85", "\x7f", "\x01", '"', "'", "=", "\\x41",
]  # fmt: skip


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[JobSpec, JobUnits]]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    (tmp_path / "train.py").write_text("pass\n")
    args = cli.build_parser().parse_args(
        ["start", "--job", "x%y", "--nproc", "2", "--grace", "2.5", "train.py"]
    )
    args.manager = cli.default_manager(args.manager)
    yield plan(cli.start_options(args))


def values(props: object) -> dict[str, object]:
    return {p.name: (p.signature, p.value) for p in props}  # type: ignore[attr-defined]


@pytest.mark.parametrize("word", ODD)
def test_a_word_survives_the_unit_file(word: str) -> None:
    assert exec_words(systemd_word(word).replace("%%", "%")) == [word]


def test_the_anchor_is_what_supervisor_anchor_built(job: tuple[JobSpec, JobUnits]) -> None:
    spec, units = job
    anchor = units.anchor(os.getpid())
    assert anchor.name == "gpulaunch-x\\x25y-anchor.service"
    assert anchor.template.name == "anchor.service"
    argv = [sys.executable, "-I", "-S", "-c", ANCHOR_PROGRAM, str(os.getpid())]
    assert values(anchor.properties) == {
        "Description": ("s", "gpulaunch job x%y: anchor"),
        "Slice": ("s", spec.names.job_slice),
        "PropagatesStopTo": ("as", [spec.names.job_slice]),
        "CollectMode": ("s", "inactive-or-failed"),
        "ExecStart": ("a(sasb)", [(sys.executable, [*argv, start_time(os.getpid())], False)]),
        "WorkingDirectory": ("s", "/"),
        "StandardInput": ("s", "null"),
        "StandardOutput": ("s", "null"),
        "StandardError": ("s", "journal"),
    }


@pytest.mark.parametrize("bus_name", ["io.gpulaunch.frontend.p12", None])
def test_the_launch_service_is_what_frontend_unit_built(
    job: tuple[JobSpec, JobUnits], bus_name: str | None
) -> None:
    spec, units = job
    argv = ["/usr/bin/python3", "-m", "gpulaunch", "start", "--frontend-child", *ODD]
    env, dropped = environment({f"V{i}": value for i, value in enumerate(ODD)} | {"A-B": "1"})
    assert dropped == ["A-B", "V16", "V17"]  # \x7f, \x01: systemd refuses them (we say so)
    limits = {"NOFILE": (1024, -1), "CPU": (-1, -1), "NICE": (0, 0)}
    cwd = "/tmp/a b%c é"
    setup = launch_setup(argv=argv, cwd=cwd, env=env, frontend_name=bus_name, limits=limits)
    unit = units.launch(setup)
    assert unit.name == "gpulaunch-x\\x25y-launch.service"
    tied = {"Type": ("s", "dbus"), "BusName": ("s", bus_name)} if bus_name else {}
    assert values(service_properties(unit)) == {
        "Description": ("s", "gpulaunch job x%y: the watcher, for its front end"),
        "Slice": ("s", "gpulaunch.slice"),
        "ExecStart": ("a(sasb)", [(argv[0], argv, False)]),
        "WorkingDirectory": ("s", cwd),
        "Environment": ("as", env),
        "StandardInputFileDescriptor": ("h", 0),
        "StandardOutputFileDescriptor": ("h", 1),
        "StandardErrorFileDescriptor": ("h", 2),
        "AddRef": ("b", True),
        "CollectMode": ("s", "inactive-or-failed"),
        "TimeoutStopUSec": ("t", 12_500_000),  # grace 2.5 s + 10 s
        "SendSIGHUP": ("b", False),
        "LimitNOFILE": ("t", INF),
        "LimitNOFILESoft": ("t", 1024),
        "LimitCPU": ("t", INF),
        "LimitCPUSoft": ("t", INF),
        "LimitNICE": ("t", 0),
        "LimitNICESoft": ("t", 0),
        **(tied or {"Type": ("s", "exec")}),
    }


def test_the_anchor_template_keeps_its_guarantee(job: tuple[JobSpec, JobUnits]) -> None:
    spec, units = job
    text = units.anchor(os.getpid()).text
    broken = text.replace(f"PropagatesStopTo={spec.names.job_slice}", "")
    props = parse_unit(broken, "service", "anchor.service")
    from gpulaunch.units.guarantees import JobUnitNames, check_unit

    names = JobUnitNames(spec.names.job_slice, spec.names.ranks_slice, spec.names.watcher_scope)
    with pytest.raises(UnitFileError, match="PropagatesStopTo= must name"):
        check_unit("anchor.service", props, broken, "anchor.service", names)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("ExecStart=python3 x", "'python3' is not an absolute path"),
        ("ExecStart=+/bin/true", "the prefix '+' is not supported"),
        ('ExecStart=/bin/echo "a', "unbalanced quotes"),
        ("ExecStart=/bin/echo \\q", "bad escape \\q"),
        ("Environment=1A=b", "'1A=b' is not NAME=VALUE"),
        ("LimitNOFILE=2:1", "the soft limit 2 is above the hard limit 1"),
        ("LimitNOFILE=1K", "not a number or infinity"),
        ("User=nobody", "User= is not supported by gpulaunch's unit codec"),
    ],
)
def test_service_settings_the_codec_refuses(line: str, message: str) -> None:
    with pytest.raises(UnitFileError) as exc:
        parse_unit(f"[Service]\n{line}\n", "service", "x.service")
    assert message in exc.value.message, exc.value.message


def test_an_override_of_the_anchor_alone_is_used_and_checked_before_anything_starts(
    job: tuple[JobSpec, JobUnits], tmp_path: Path
) -> None:
    from gpulaunch.units.job import render_units
    from gpulaunch.units.templates import Templates, builtin_dir

    spec, _ = job
    override = tmp_path / "units"
    override.mkdir(mode=0o755)
    text = (builtin_dir() / "anchor.service").read_text()
    (override / "anchor.service").write_text(text.replace("StandardError=journal", "# mine"))
    units = render_units(spec, Templates([override], uid=os.geteuid()))
    anchor = units.anchor(os.getpid())
    assert anchor.template == override / "anchor.service"  # file by file: the others built-in
    assert units.watcher.template == builtin_dir() / "watcher.scope"
    assert "StandardError" not in values(anchor.properties)

    (override / "anchor.service").write_text(text.replace("PropagatesStopTo=", "#"))
    with pytest.raises(UnitFileError, match="PropagatesStopTo= must name"):
        render_units(spec, Templates([override], uid=os.geteuid()))  # at plan time


@pytest.mark.parametrize("cwd", ["/tmp/ends in a space ", "/tmp/new\nline"])
def test_a_directory_unit_files_cannot_name_is_one_clear_error(
    job: tuple[JobSpec, JobUnits], cwd: str
) -> None:
    from gpulaunch.errors import UsageError

    _, units = job
    setup = launch_setup(argv=["/bin/true"], cwd=cwd, env=[], frontend_name=None, limits={})
    with pytest.raises(UsageError, match="cannot be a systemd service's working directory"):
        units.launch(setup)


def test_launch_service_snapshot(job: tuple[JobSpec, JobUnits]) -> None:
    """The text of units/launch.service for a fixed front end (tests/unit/snapshots/; after an
    intended change: GPULAUNCH_UPDATE_SNAPSHOTS=1, then review the diff)."""
    _, units = job
    setup = launch_setup(
        argv=[
            "/usr/bin/python3",
            "-m",
            "gpulaunch",
            "start",
            "--frontend-child",
            "--job",
            "x%y",
            "train.py",
            "--lr",
            "0.1 0.2",
        ],  # fmt: skip
        cwd="/home/ada/exp 1",
        env=["HOME=/home/ada", 'PS1=\\u@\\h "$ "', "LANG=C.UTF-8"],
        frontend_name="io.gpulaunch.frontend.p4242",
        limits={"NOFILE": (1024, 524288), "CORE": (0, -1)},
    )
    text = units.launch(setup).text
    snapshot = Path(__file__).parent / "snapshots" / "gpulaunch-demo-launch.service.txt"
    if os.environ.get("GPULAUNCH_UPDATE_SNAPSHOTS") == "1":
        snapshot.write_text(text)
    assert text == snapshot.read_text(), f"{snapshot} differs; see the docstring"


def test_the_tie_waits_for_the_front_end_and_stops_its_service(
    job: tuple[JobSpec, JobUnits],
) -> None:
    """units/tie.service: the front end's death tie without a user bus (issue 29)."""
    spec, units = job
    tie = units.tie(os.getpid())
    props = values(tie.properties)
    assert tie.name == spec.names.tie_service
    service = spec.names.launch_service
    assert props["PropagatesStopTo"] == ("as", [service]) == props["BindsTo"]
    assert props["ExecStart"][1] == [
        (sys.executable, [sys.executable, "-I", "-S", "-c", ANCHOR_PROGRAM,
                          str(os.getpid()), start_time(os.getpid())], False)
    ]  # fmt: skip
