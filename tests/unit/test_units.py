"""The real templates, rendered and parsed; template lookup; the strict environment.

Snapshots of the rendered text and the properties live in tests/unit/snapshots/.
After an intended change, regenerate them with

    GPULAUNCH_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/unit/test_units.py

and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpulaunch.errors import TemplateError, UnitFileError
from gpulaunch.units.codec import Property
from gpulaunch.units.templates import (
    TEMPLATE_NAMES,
    Templates,
    UnitDefinition,
    builtin_dir,
    systemd_quote,
    systemd_text,
    timespan,
)
from tests.unit.fakes import (
    COMMON,
    ORDINARY,
    REPO_UNITS,
    by_name,
    marker_template,
    rank_context,
    write,
)

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("GPULAUNCH_UPDATE_SNAPSHOTS") == "1"


def empty_templates(tmp_path: Path) -> Templates:
    """Only the built-in templates: no /etc or ~/.config lookups."""
    return Templates(system_dir=tmp_path / "etc", environ={"HOME": str(tmp_path / "home")})


def render_job(templates: Templates) -> list[UnitDefinition]:
    units = [
        templates.render("job.slice", "gpulaunch-demo.slice", COMMON),
        templates.render("ranks.slice", "gpulaunch-demo-ranks.slice", COMMON),
        templates.render("watcher.scope", "gpulaunch-demo-watcher.scope", COMMON),
    ]
    units += [
        templates.render("rank.scope", f"gpulaunch-demo-rank{r}.scope", rank_context(r))
        for r in range(4)
    ]
    return units


def properties_text(properties: tuple[Property, ...]) -> str:
    return "".join(f"{p.name} {p.signature} {p.value!r}\n" for p in properties)


def check_snapshot(path: Path, actual: str) -> None:
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(actual)
    assert path.exists(), f"no snapshot {path}; run with GPULAUNCH_UPDATE_SNAPSHOTS=1"
    assert actual == path.read_text(), f"{path} differs; see the module docstring"


def test_builtin_templates_are_the_repository_units() -> None:
    assert builtin_dir() == REPO_UNITS
    assert all((REPO_UNITS / name).is_file() for name in TEMPLATE_NAMES)


def test_snapshots(tmp_path: Path) -> None:
    for unit in render_job(empty_templates(tmp_path)):
        assert unit.template == REPO_UNITS / unit.template.name
        check_snapshot(SNAPSHOTS / f"{unit.name}.txt", unit.text)
        check_snapshot(SNAPSHOTS / f"{unit.name}.properties", properties_text(unit.properties))


def test_rank_scope_guarantees(tmp_path: Path) -> None:
    """What docs/architecture.md relies on, independent of the snapshot."""
    rank = empty_templates(tmp_path).render(
        "rank.scope", "gpulaunch-demo-rank2.scope", rank_context(2)
    )
    props = by_name(rank.properties)
    assert props["Description"] == "gpulaunch job demo rank 2 (GPU 2)"
    assert props["BindsTo"] == ["gpulaunch-demo-watcher.scope"]
    assert props["After"] == ["gpulaunch-demo-watcher.scope"]
    assert props["CollectMode"] == "inactive-or-failed"
    assert props["Slice"] == "gpulaunch-demo-ranks.slice"
    assert props["TimeoutStopUSec"] == 30_000_000
    assert props["SendSIGKILL"] is True
    assert props["KillMode"] == "control-group"
    assert props["MemoryMax"] == 48 * 2**30
    assert props["AllowedCPUs"] == bytes([0, 0, 0xFF, 0, 0, 0, 0, 0])
    assert props["DevicePolicy"] == "closed"
    assert props["DeviceAllow"] == [
        ("/dev/char/195:255", "rw"),
        ("char-nvidia-uvm", "rw"),
        ("/dev/char/195:2", "rw"),
    ]


def test_watcher_and_slice_guarantees(tmp_path: Path) -> None:
    templates = empty_templates(tmp_path)
    watcher = by_name(
        templates.render("watcher.scope", "gpulaunch-demo-watcher.scope", COMMON).properties
    )
    assert watcher["PropagatesStopTo"] == ["gpulaunch-demo.slice"]
    assert watcher["CollectMode"] == "inactive-or-failed"
    assert watcher["TimeoutStopUSec"] == 45_000_000  # grace + 15 s
    assert watcher["Slice"] == "gpulaunch-demo.slice"
    job = by_name(templates.render("job.slice", "gpulaunch-demo.slice", COMMON).properties)
    assert job == {
        "Description": "gpulaunch job demo: train.py --epochs 3",
        "MemoryMax": 200 * 2**30,
    }
    ranks = by_name(
        templates.render("ranks.slice", "gpulaunch-demo-ranks.slice", COMMON).properties
    )
    assert ranks == {"Description": "gpulaunch job demo: 4 ranks"}


def test_unset_values_emit_nothing(tmp_path: Path) -> None:
    context = {
        **rank_context(0),
        "gpu": None,
        "cpus": None,
        "memory_max": None,
        "device_allow": [],
        "job_memory_max": None,
        "description": "",
        "grace_sec": 2.5,
    }
    templates = empty_templates(tmp_path)
    rank = by_name(templates.render("rank.scope", "gpulaunch-demo-rank0.scope", context).properties)
    assert rank["Description"] == "gpulaunch job demo rank 0"
    assert rank["TimeoutStopUSec"] == 2_500_000
    for absent in ("MemoryMax", "AllowedCPUs", "DevicePolicy", "DeviceAllow"):
        assert absent not in rank
    job = templates.render("job.slice", "gpulaunch-demo.slice", context)
    assert by_name(job.properties) == {"Description": "gpulaunch job demo"}
    assert "None" not in job.text


def test_odd_job_names_survive_in_descriptions(tmp_path: Path) -> None:
    job = '50% of "ünïcødé" \\x2d\nnext line\ttab %n \\'
    context = {**rank_context(1), "job": job, "description": "a\r\nb"}
    templates = empty_templates(tmp_path)
    rank = templates.render("rank.scope", "gpulaunch-demo-rank1.scope", context)
    expected = 'gpulaunch job 50% of "ünïcødé" \\x2d next line tab %n rank 1 (GPU 1)'
    assert by_name(rank.properties)["Description"] == expected
    plain = templates.render("rank.scope", "gpulaunch-demo-rank1.scope", rank_context(1))
    assert rank.text.count("\n") == plain.text.count("\n")  # no line was added
    job_slice = templates.render("job.slice", "gpulaunch-demo.slice", context)
    assert by_name(job_slice.properties)["Description"] == (
        'gpulaunch job 50% of "ünïcødé" \\x2d next line tab %n: a  b'
    )


def test_a_bad_value_names_the_template_and_the_setting(tmp_path: Path) -> None:
    context = {**rank_context(0), "memory_max": "12Q"}
    with pytest.raises(UnitFileError) as info:
        empty_templates(tmp_path).render("rank.scope", "gpulaunch-demo-rank0.scope", context)
    exc = info.value
    template = REPO_UNITS / "rank.scope"
    line = template.read_text().splitlines().index("MemoryMax={{ memory_max }}") + 1
    assert (exc.source, exc.line, exc.setting) == (str(template), line, "MemoryMax")
    assert exc.message.startswith(f"{template}:{line}: MemoryMax=12Q: not a size; ")
    good = empty_templates(tmp_path).render("rank.scope", "x.scope", rank_context(0))
    rendered = good.text.splitlines().index("MemoryMax=48G") + 1
    assert exc.hint == (
        "see systemd.resource-control(5); "
        f"line {rendered} of the text rendered for gpulaunch-demo-rank0.scope"
    )


def test_a_bad_setting_of_an_ambiguous_line_keeps_the_rendered_line(tmp_path: Path) -> None:
    write(
        tmp_path / "o", "job.slice", "[Unit]\n{% for x in [1, 2] %}\nMemoryMax=1G\n{% endfor %}\n"
    )
    templates = Templates([tmp_path / "o"], system_dir=tmp_path / "etc", environ={})
    with pytest.raises(UnitFileError) as info:
        templates.render("job.slice", "x.slice", COMMON)
    assert info.value.message.startswith(f"{tmp_path / 'o' / 'job.slice'}:3: MemoryMax= belongs")
    write(tmp_path / "o", "job.slice", "{# two\nlines #}\n[Unit]\n{{ 'MemoryMax' }}=1G\n")
    with pytest.raises(UnitFileError) as info:
        templates.render("job.slice", "x.slice", COMMON)
    assert info.value.line == 2  # no template line starts with MemoryMax=
    assert info.value.hint == "line 2 of the text rendered for x.slice"


# The least a scope template must set (gpulaunch/units/guarantees.py).
MINIMAL_SCOPES = {
    "rank.scope": (
        "BindsTo={{ watcher_scope }}\nAfter={{ watcher_scope }}\nCollectMode=inactive-or-failed\n"
        "[Scope]\nSlice={{ ranks_slice }}\n"
    ),
    "watcher.scope": (
        "PropagatesStopTo={{ job_slice }}\nCollectMode=inactive-or-failed\n"
        "[Scope]\nSlice={{ job_slice }}\n"
    ),
}


def marker_scope(template: str, marker: str) -> str:
    return f"[Unit]\nDescription={marker}\n{MINIMAL_SCOPES[template]}"


def test_search_order(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    system, config, builtin = tmp_path / "etc", tmp_path / "config", tmp_path / "builtin"
    for directory in (first, second, system, config / "gpulaunch" / "units", builtin):
        write(directory, "ranks.slice", marker_template(directory.name))
    write(second, "job.slice", marker_template("second"))
    write(system, "watcher.scope", marker_scope("watcher.scope", "etc"))
    write(config / "gpulaunch" / "units", "rank.scope", marker_scope("rank.scope", "config"))
    write(builtin, "rank.scope", marker_scope("rank.scope", "builtin"))
    templates = Templates(
        [first, second],
        system_dir=system,
        environ={"XDG_CONFIG_HOME": str(config)},
        builtin=builtin,
        uid=ORDINARY,
    )
    assert templates.search_path == (first, second, system, config / "gpulaunch" / "units", builtin)

    def description(template: str, unit: str) -> object:
        return by_name(templates.render(template, unit, COMMON).properties)["Description"]

    assert description("ranks.slice", "x.slice") == "first"  # in every directory
    assert description("job.slice", "x.slice") == "second"
    assert description("watcher.scope", "x.scope") == "etc"
    assert description("rank.scope", "x.scope") == "config"
    assert templates.find("rank.scope") == config / "gpulaunch" / "units" / "rank.scope"


def test_user_directory_without_xdg_config_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    user = home / ".config" / "gpulaunch" / "units"
    path = write(user, "job.slice", marker_template("home"))
    for environ in ({"HOME": str(home)}, {"HOME": str(home), "XDG_CONFIG_HOME": "relative"}):
        templates = Templates(system_dir=tmp_path / "etc", environ=environ, uid=ORDINARY)
        assert templates.search_path[-2] == user
        assert templates.find("job.slice") == path
        assert templates.find("rank.scope") == REPO_UNITS / "rank.scope"


def test_an_undefined_variable_names_file_line_and_variable(tmp_path: Path) -> None:
    write(tmp_path / "o", "rank.scope", "[Unit]\n# note\nDescription={{ rank_name }}\n[Scope]\n")
    templates = Templates([tmp_path / "o"], system_dir=tmp_path / "etc", environ={})
    with pytest.raises(TemplateError) as info:
        templates.render("rank.scope", "x.scope", rank_context(0))
    assert info.value.message == f"{tmp_path / 'o' / 'rank.scope'}:3: 'rank_name' is undefined"
    assert info.value.hint and "local_rank" in info.value.hint
    assert info.value.exit_code == 78


def test_the_real_templates_need_every_variable(tmp_path: Path) -> None:
    context = rank_context(0)
    del context["watcher_scope"]
    with pytest.raises(TemplateError) as info:
        empty_templates(tmp_path).render("rank.scope", "x.scope", context)
    assert f"{REPO_UNITS / 'rank.scope'}:" in info.value.message
    assert "'watcher_scope' is undefined" in info.value.message


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("Description={{ gpu }}", 3, "a value is None; guard it with {% if ... is not none %}"),
        ("Description={{ job }}", 3, "contains a line break; use the systemd_text filter"),
        ("Description={{ 1 // 0 }}", 3, "integer division or modulo by zero"),
        ("DeviceAllow={{ 'a\"b\\'c' | systemd_quote }}", 3, "cannot quote"),
        ("TimeoutStopSec={{ 'x' | timespan }}", 3, "timespan needs a number of seconds"),
    ],
)
def test_render_errors_name_file_and_line(
    tmp_path: Path, body: str, line: int, message: str
) -> None:
    write(tmp_path / "o", "rank.scope", f"[Unit]\n\n{body}\n[Scope]\n")
    templates = Templates([tmp_path / "o"], system_dir=tmp_path / "etc", environ={})
    context = {**rank_context(0), "gpu": None, "job": "two\nlines"}
    with pytest.raises(TemplateError) as info:
        templates.render("rank.scope", "x.scope", context)
    assert info.value.message.startswith(f"{tmp_path / 'o' / 'rank.scope'}:{line}: ")
    assert message in info.value.message


def test_a_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    write(tmp_path / "o", "job.slice", "[Unit]\n{% if job %}\nDescription=x\n")
    templates = Templates([tmp_path / "o"], system_dir=tmp_path / "etc", environ={})
    with pytest.raises(TemplateError) as info:
        templates.render("job.slice", "x.slice", COMMON)
    assert info.value.message.startswith(f"{tmp_path / 'o' / 'job.slice'}:3: template syntax error")
    assert "Unexpected end of template" in info.value.message
    assert "\n" not in info.value.message


def test_a_missing_template(tmp_path: Path) -> None:
    templates = Templates(system_dir=tmp_path / "etc", environ={}, builtin=tmp_path / "none")
    with pytest.raises(TemplateError) as info:
        templates.render("job.slice", "x.slice", COMMON)
    assert "template job.slice not found" in info.value.message
    assert str(tmp_path / "none") in info.value.message


def test_programming_errors(tmp_path: Path) -> None:
    templates = empty_templates(tmp_path)
    with pytest.raises(ValueError):
        templates.render("other.scope", "x.scope", COMMON)
    with pytest.raises(ValueError):
        templates.render("job.slice", "x.scope", COMMON)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain", "plain"),
        ("50%", "50%%"),
        ("two\nlines\r\n", "two lines"),
        ("  padded\t", "padded"),
        ("bell\x07 del\x7f", "bell  del"),
        ("ünïcødé ✓", "ünïcødé ✓"),
        ("ends in \\", "ends in"),
        ("ends in \\\\", "ends in"),
        (42, "42"),
    ],
)
def test_systemd_text(value: object, text: str) -> None:
    assert systemd_text(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("/dev/nvidia0", "/dev/nvidia0"),
        ("/dev/my dev", '"/dev/my dev"'),
        ('say "hi"', "'say \"hi\"'"),
        ("", '""'),
        ("100%", "100%%"),
    ],
)
def test_systemd_quote(value: str, text: str) -> None:
    assert systemd_quote(value) == text


@pytest.mark.parametrize("value", ["a\"b'c", "back\\slash", "new\nline"])
def test_systemd_quote_refuses_what_it_cannot_quote(value: str) -> None:
    with pytest.raises(ValueError):
        systemd_quote(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (30, "30s"),
        (0, "0s"),
        (2.5, "2500ms"),
        (45.0, "45s"),
        (0.1 + 15, "15100ms"),
        (0.0001, "100us"),
        (float("inf"), "infinity"),
    ],
)
def test_timespan(seconds: float, text: str) -> None:
    assert timespan(seconds) == text


@pytest.mark.parametrize("seconds", [True, "30", None, -1, float("nan")])
def test_timespan_refuses(seconds: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        timespan(seconds)


def test_timespan_round_trips_through_the_codec(tmp_path: Path) -> None:
    for grace in (0, 1, 2.5, 0.001, 90, 3600.25):
        context = {**rank_context(0), "grace_sec": grace}
        rank = empty_templates(tmp_path).render("rank.scope", "x.scope", context)
        assert by_name(rank.properties)["TimeoutStopUSec"] == round(grace * 1_000_000)
    context = {**rank_context(0), "grace_sec": float("inf")}
    with pytest.raises(UnitFileError, match="TimeoutStopSec=infinity waits forever"):
        empty_templates(tmp_path).render("rank.scope", "x.scope", context)
