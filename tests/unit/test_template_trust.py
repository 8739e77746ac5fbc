"""Templates are untrusted input: the sandbox, where root looks, who may change them, and
the settings no template may take away (issue 13, item 9).

Real files in tmp_path with real modes and owners. As root, "another user's file" is a file
chowned to nobody; as an ordinary user it is one of ours, checked for a different uid.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpulaunch import cli
from gpulaunch.errors import TemplateError, UnitFileError
from gpulaunch.units.templates import Templates
from tests.unit.fakes import (
    COMMON,
    ORDINARY,
    REPO_UNITS,
    by_name,
    marker_template,
    rank_context,
    write,
)

EXPLOIT = "{{ lipsum.__globals__['os'].popen('touch %s').read() }}"
NOBODY = 65534


def templates(tmp_path: Path, *dirs: Path, uid: int = ORDINARY) -> Templates:
    return Templates(
        dirs, system_dir=tmp_path / "etc", environ={"HOME": str(tmp_path / "home")}, uid=uid
    )


def someone_else(path: Path) -> int:
    """Make `path` another user's file; return the uid to check it as."""
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)
        return 0
    return os.geteuid() + 1


def private_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    path.chmod(0o755)
    return path


# --- the sandbox ----------------------------------------------------------------------------


def test_a_sandbox_escape_is_refused_and_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = write(
        private_dir(tmp_path / "o"),
        "job.slice",
        f"[Unit]\n# a comment\nDescription={EXPLOIT % marker}\n[Slice]\n",
    )
    with pytest.raises(TemplateError) as info:
        templates(tmp_path, tmp_path / "o").render("job.slice", "x.slice", COMMON)
    assert not marker.exists()
    assert info.value.message.startswith(f"{path}:3: refused by the sandbox: ")
    assert "__globals__" in info.value.message and "\n" not in info.value.message
    assert info.value.exit_code == 78


@pytest.mark.parametrize(
    "expression",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ job.__class__ }}",
        "{% set _ = argv.append('--evil') %}",  # the variables are read-only
        "{{ cycler.__init__.__globals__ }}",
    ],
)
def test_the_sandbox_refuses(tmp_path: Path, expression: str) -> None:
    write(private_dir(tmp_path / "o"), "job.slice", f"[Unit]\n{expression}\n[Slice]\n")
    with pytest.raises(TemplateError, match="refused by the sandbox"):
        templates(tmp_path, tmp_path / "o").render("job.slice", "x.slice", COMMON)


# --- where root looks -----------------------------------------------------------------------


def test_root_never_reads_a_user_directory(tmp_path: Path) -> None:
    """`sudo -E gpulaunch render`: HOME is another user's, whose template must not run."""
    marker = tmp_path / "pwned"
    home = tmp_path / "home"
    user_units = home / ".config" / "gpulaunch" / "units"
    write(user_units, "job.slice", f"[Unit]\nDescription={EXPLOIT % marker}\n[Slice]\n")
    for environ in ({"HOME": str(home)}, {"XDG_CONFIG_HOME": str(home / ".config")}):
        root = Templates(system_dir=tmp_path / "etc", environ=environ, uid=0)
        assert user_units not in root.search_path
        assert root.find("job.slice") == REPO_UNITS / "job.slice"
        root.render("job.slice", "gpulaunch-demo.slice", COMMON)
    assert not marker.exists()
    ordinary = Templates(system_dir=tmp_path / "etc", environ={"HOME": str(home)}, uid=ORDINARY)
    assert user_units in ordinary.search_path


# --- who may change a template --------------------------------------------------------------


def test_a_world_writable_directory_is_refused_even_without_the_file(tmp_path: Path) -> None:
    units = private_dir(tmp_path / "o")
    units.chmod(0o777)
    with pytest.raises(TemplateError) as info:
        templates(tmp_path, units).render("job.slice", "x.slice", COMMON)
    assert info.value.message == (
        f"refusing templates in {units}: {units} is writable by group and others "
        f"(mode 0777); run chmod go-w {units}"
    )
    assert info.value.exit_code == 78


def test_a_group_writable_parent_is_refused(tmp_path: Path) -> None:
    parent = private_dir(tmp_path / "shared")
    units = private_dir(parent / "units")
    path = write(units, "ranks.slice", marker_template("mine"))
    parent.chmod(0o775)
    with pytest.raises(TemplateError) as info:
        templates(tmp_path, units).render("ranks.slice", "x.slice", COMMON)
    assert f"{parent} is writable by group (mode 0775)" in info.value.message
    parent.chmod(0o755)
    path.chmod(0o664)
    with pytest.raises(TemplateError, match=f"refusing {path}: {path} is writable by group"):
        templates(tmp_path, units).render("ranks.slice", "x.slice", COMMON)
    path.chmod(0o644)
    rendered = templates(tmp_path, units).render("ranks.slice", "x.slice", COMMON)
    assert by_name(rendered.properties)["Description"] == "mine"


def test_a_sticky_directory_may_be_world_writable_but_not_the_file(tmp_path: Path) -> None:
    units = private_dir(tmp_path / "sticky")
    units.chmod(0o1777)
    path = write(units, "ranks.slice", marker_template("sticky"))
    path.chmod(0o644)
    rendered = templates(tmp_path, units).render("ranks.slice", "x.slice", COMMON)
    assert by_name(rendered.properties)["Description"] == "sticky"
    path.chmod(0o666)
    with pytest.raises(TemplateError, match="writable by group and others"):
        templates(tmp_path, units).render("ranks.slice", "x.slice", COMMON)


def test_another_users_template_is_refused(tmp_path: Path) -> None:
    units = private_dir(tmp_path / "o")
    path = write(units, "ranks.slice", marker_template("theirs"))
    path.chmod(0o644)
    uid = someone_else(path)
    with pytest.raises(TemplateError) as info:
        templates(tmp_path, units, uid=uid).render("ranks.slice", "x.slice", COMMON)
    # As root the file is nobody's; as an ordinary user, checked for another uid, the
    # directory above it already is someone else's.
    refused = path if os.geteuid() == 0 else f"templates in {units}"
    assert info.value.message.startswith(f"refusing {refused}: ")
    assert " is owned by " in info.value.message
    assert "not by you or root" in info.value.message


def test_a_symlink_into_a_writable_directory_is_refused(tmp_path: Path) -> None:
    open_dir = private_dir(tmp_path / "open")
    target = write(open_dir, "ranks.slice", marker_template("linked"))
    target.chmod(0o644)
    open_dir.chmod(0o777)
    units = private_dir(tmp_path / "o")
    (units / "ranks.slice").symlink_to(target)
    with pytest.raises(TemplateError, match=f"{open_dir} is writable by group and others"):
        templates(tmp_path, units).render("ranks.slice", "x.slice", COMMON)


def test_the_builtin_templates_are_trusted_like_the_code(tmp_path: Path) -> None:
    builtin = private_dir(tmp_path / "builtin")
    write(builtin, "ranks.slice", marker_template("builtin")).chmod(0o666)
    found = Templates(
        system_dir=tmp_path / "etc", environ={"HOME": str(tmp_path)}, builtin=builtin, uid=0
    )
    rendered = found.render("ranks.slice", "x.slice", COMMON)
    assert by_name(rendered.properties)["Description"] == "builtin"


# --- what no template may take away ---------------------------------------------------------


def _edited(template: str, old: str, new: str) -> str:
    text = (REPO_UNITS / template).read_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


RANK_SLICE, RANK_BINDS = "Slice={{ ranks_slice }}\n", "BindsTo={{ watcher_scope }}\n"
RANK_AFTER, COLLECT = "After={{ watcher_scope }}\n", "CollectMode=inactive-or-failed\n"
KILL_MODE = "KillMode=control-group\n"


@pytest.mark.parametrize(
    ("template", "old", "new", "problem"),
    [
        ("rank.scope", KILL_MODE, "KillMode=none\n", "KillMode=none would leave processes"),
        ("rank.scope", KILL_MODE, "KillMode=process\n", "KillMode=process would leave"),
        ("rank.scope", "SendSIGKILL=yes\n", "SendSIGKILL=no\n", "SendSIGKILL=no lets a process"),
        ("rank.scope", KILL_MODE, KILL_MODE + "FinalKillSignal=SIGTERM\n", "FinalKillSignal="),
        ("rank.scope", "{{ grace_sec | timespan }}", "infinity", "TimeoutStopSec=infinity"),
        ("rank.scope", RANK_SLICE, "Slice=gpulaunch.slice\n", "Slice=gpulaunch.slice is not"),
        ("rank.scope", RANK_SLICE, "", "Slice= is missing: the rank scope must be in gpulaunch-"),
        ("rank.scope", RANK_BINDS, "", "BindsTo= must name gpulaunch-demo-watcher.scope"),
        ("rank.scope", RANK_AFTER, RANK_AFTER + "BindsTo=\n", "BindsTo= must name"),
        ("rank.scope", RANK_AFTER, "", "After= must name gpulaunch-demo-watcher.scope"),
        ("rank.scope", RANK_AFTER, RANK_AFTER + "Before={{ watcher_scope }}\n", "ordering cycle"),
        ("rank.scope", COLLECT, "CollectMode=inactive\n", "CollectMode=inactive: a scope"),
        ("rank.scope", COLLECT, "", "CollectMode= is missing"),
        ("rank.scope", COLLECT, COLLECT + "RefuseManualStop=yes\n", "RefuseManualStop=yes"),
        ("watcher.scope", "PropagatesStopTo={{ job_slice }}\n", "", "PropagatesStopTo= must"),
        ("watcher.scope", "Slice={{ job_slice }}", "Slice={{ ranks_slice }}", "Slice=gpulaunch-"),
        ("watcher.scope", "[Scope]\n", "[Scope]\nKillMode=none\n", "KillMode=none"),
        ("watcher.scope", "[Scope]\n", "[Scope]\nSendSIGKILL=no\n", "SendSIGKILL=no"),
        ("ranks.slice", "[Unit]\n", "[Unit]\nRefuseManualStop=yes\n", "RefuseManualStop=yes"),
        ("job.slice", "[Unit]\n", "[Unit]\nRefuseManualStop=yes\n", "RefuseManualStop=yes"),
    ],
)
def test_a_template_may_not_defeat_the_guarantees(
    tmp_path: Path, template: str, old: str, new: str, problem: str
) -> None:
    text = _edited(template, old, new)
    path = write(private_dir(tmp_path / "o"), template, text)
    unit = "gpulaunch-demo-rank0.scope" if template == "rank.scope" else f"x.{template[-5:]}"
    with pytest.raises(UnitFileError) as info:
        templates(tmp_path, tmp_path / "o").render(template, unit, rank_context(0))
    exc = info.value
    assert exc.message.startswith(f"{path}:{exc.line}: ")
    assert problem in exc.message and "\n" not in exc.message
    if new.strip() and "=" in new.strip().splitlines()[-1]:
        key = new.strip().splitlines()[-1].partition("=")[0]
        if key == exc.setting and text.count(f"\n{key}=") == 1:  # that line is named
            assert text.splitlines()[exc.line - 1].startswith(f"{key}=")
    assert exc.exit_code == 78


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (KILL_MODE, "KillMode=mixed\n"),
        (KILL_MODE, ""),  # control-group is systemd's default
        ("SendSIGKILL=yes\n", "FinalKillSignal=SIGKILL\n"),
        ("TimeoutStopSec={{ grace_sec | timespan }}\n", ""),  # DefaultTimeoutStopSec=
        (KILL_MODE, "Delegate=yes\nRuntimeMaxSec=1h\nOOMPolicy=kill\n"),
        (RANK_BINDS, "BindsTo=other.service {{ watcher_scope }}\n"),
    ],
)
def test_what_keeps_the_guarantees_is_accepted(tmp_path: Path, old: str, new: str) -> None:
    write(private_dir(tmp_path / "o"), "rank.scope", _edited("rank.scope", old, new))
    found = templates(tmp_path, tmp_path / "o")
    found.render("rank.scope", "gpulaunch-demo-rank0.scope", rank_context(0))


def test_render_refuses_a_template_that_defeats_them_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "train.py").write_text("print('training')\n")
    units = private_dir(tmp_path / "o")
    write(units, "rank.scope", _edited("rank.scope", KILL_MODE, "KillMode=none\n"))
    with pytest.raises(SystemExit) as exit_:
        cli.main(["render", "--units-dir", str(units), "--job", "demo", "train.py"])
    err = capsys.readouterr().err
    assert exit_.value.code == 78
    assert err.startswith(f"gpulaunch: error: {units / 'rank.scope'}:")
    assert "KillMode=none" in err and err.count("\n") == 1


@pytest.mark.parametrize("grace", ["inf", "nan", "infinity"])
def test_grace_must_be_finite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], grace: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["render", "--grace", grace, "train.py"])
    assert exit_.value.code == 2
    # A stop that never escalates to SIGKILL would leave ranks behind (units/guarantees.py).
    assert "--grace must be between 0 and 1000000000 seconds" in capsys.readouterr().err
