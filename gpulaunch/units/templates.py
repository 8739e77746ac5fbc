"""Unit templates: where they are found, how they are rendered, what they become.

The slice and scope units of a job are jinja2 templates in unit-file syntax
(docs/architecture.md, "The units of a job"). `Templates` finds
them, renders one per unit with a strict environment and turns the text into
typed D-Bus properties with `gpulaunch.units.codec`. `gpulaunch render` prints the
rendered text.

Search order, first match per template file wins (each file is looked up on its
own, so an override directory may hold just `rank.scope`):

1. the `--units-dir` directories, in the order given;
2. `/etc/gpulaunch/units/`;
3. `$XDG_CONFIG_HOME/gpulaunch/units/` (default `~/.config/gpulaunch/units/`), but
   never for root: `$HOME` and `$XDG_CONFIG_HOME` may name another user's directory
   (`sudo -E`), so root reads only the directories it names itself and `/etc`;
4. the built-in templates, the repository's top-level `units/` (package data in a wheel,
   `gpulaunch.shipped`).

Trust. Templates are rendered in jinja2's sandbox (`ImmutableSandboxedEnvironment`):
no attributes starting with `_`, no calls to unsafe functions, no changes to the
variables; a template that tries gets a `TemplateError` naming its line. A template
outside the built-in directory is read only if nobody but the invoking user and root
can change it or any directory above it (`gpulaunch.units.trust`), and an existing
search directory that others can change is refused even when the file is elsewhere.
A rendered unit that would defeat the job's guarantees (`KillMode=none`, `Slice=`
outside the job, `BindsTo=` removed, ...) is refused with the reason
(`gpulaunch.units.guarantees`).

Template context: the fields of `JobVars` (every template), `RankVars` (`rank.scope`),
`AnchorVars` (`anchor.service`) and `LaunchVars` (`launch.service`), typed and documented
in gpulaunch/units/variables.py. None
means "not set": guard such values with `{% if x is not none %}`. Printing
None, or a value that contains a line break, is an error.

Filters:

- `systemd_text`: free text for a one-line value such as Description=: line
  breaks and other control characters become spaces, `%` becomes `%%`.
- `systemd_quote`: one word of a list setting that takes quotes
  (Documentation=, a DeviceAllow= path): `%` becomes `%%`, quoted if needed.
- `systemd_word`: one word of ExecStart= or Environment= (any text, newlines included):
  double-quoted with C escapes, `%` -> `%%`.
- `specifier_escape`: only `%` -> `%%`.
- `timespan`: seconds (int or float) -> a systemd time span ("30s", "1500ms").

Errors: a template syntax error, an undefined variable or a failing expression
raises `TemplateError` naming the template file and line; a bad setting in the
rendered text raises `UnitFileError` (see `gpulaunch.units.codec`) naming the template
line that writes the setting (the hint gives the line in the rendered text).
"""

from __future__ import annotations

import errno
import math
import os
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import jinja2
import jinja2.sandbox

from gpulaunch import shipped
from gpulaunch.errors import TemplateError, UnitFileError
from gpulaunch.units.codec import parse_unit
from gpulaunch.units.definitions import UnitDefinition
from gpulaunch.units.guarantees import JobUnitNames, check_unit
from gpulaunch.units.trust import check_trusted, read_trusted
from gpulaunch.units.variables import context_hint

TEMPLATE_NAMES = (
    "job.slice",
    "ranks.slice",
    "watcher.scope",
    "rank.scope",
    "anchor.service",
    "launch.service",
    "tie.service",
)
SYSTEM_DIR = Path("/etc/gpulaunch/units")

_CONTEXT_HINT = context_hint()


def builtin_dir() -> Path:
    """The templates shipped with gpulaunch: top-level `units/`, package data in a wheel."""
    return shipped.units_dir()


def user_dir(environ: Mapping[str, str]) -> Path:
    """`$XDG_CONFIG_HOME/gpulaunch/units`; a relative XDG_CONFIG_HOME is ignored (XDG spec)."""
    config = environ.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(config):
        home = environ.get("HOME") or str(Path.home())
        config = os.path.join(home, ".config")
    return Path(config) / "gpulaunch" / "units"


def units_dir_problem(path: Path) -> str | None:
    """Why `--units-dir path` cannot be searched for templates, or None."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # a name too long, a loop, ...
            return f"{path}: {exc.strerror}"
    if not path.is_dir():
        return f"{path} {'is not a directory' if path.exists() else 'does not exist'}"
    if not os.access(path, os.R_OK | os.X_OK):
        return f"cannot read {path}"
    return None


def systemd_text(value: object) -> str:
    """Arbitrary text as a one-line unit-file value that systemd reads back unchanged.

    Control characters (line breaks included) become spaces, surrounding whitespace goes
    (systemd strips it), `%` is doubled (specifiers), and final backslashes are dropped
    (one would join the next line).
    """
    text = "".join(" " if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 else c for c in str(value))
    text = text.strip(" ").replace("%", "%%")
    while text.endswith("\\"):
        text = text[:-1].rstrip(" ")
    return text


def specifier_escape(value: object) -> str:
    """`%` -> `%%`, for values where systemd expands specifiers."""
    return str(value).replace("%", "%%")


def systemd_quote(value: object) -> str:
    """One word of a list setting that systemd unquotes (Documentation=, DeviceAllow= paths)."""
    text = specifier_escape(value)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise ValueError(f"cannot quote {text!r}: it contains control characters")
    if text and not any(c in " \t'\"\\" for c in text):
        return text
    if '"' not in text and "\\" not in text:
        return f'"{text}"'
    if "'" not in text and "\\" not in text:
        return f"'{text}'"
    raise ValueError(f"cannot quote {text!r} for a unit file")


def systemd_word(value: object) -> str:
    """One word of ExecStart= or Environment=, whatever it holds: double-quoted, with C escapes
    for `"`, `\\` and control characters, `%` doubled; `gpulaunch.units.codec.exec_words`
    (as systemd) reads back exactly `value`."""
    out = []
    for c in str(value):
        if c in '"\\':
            out.append("\\" + c)
        elif c in "\n\t":
            out.append("\\n" if c == "\n" else "\\t")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02x}")
        elif 0x80 <= ord(c) < 0xA0:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out).replace("%", "%%") + '"'


def timespan(seconds: object) -> str:
    """Seconds as a systemd time span, exact to the microsecond: 30 -> "30s", 2.5 -> "2500ms"."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"timespan needs a number of seconds, not {seconds!r}")
    if isinstance(seconds, float) and math.isinf(seconds) and seconds > 0:
        return "infinity"
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"timespan needs a non-negative number of seconds, not {seconds!r}")
    usec = round(seconds * 1_000_000)
    if usec % 1_000_000 == 0:
        return f"{usec // 1_000_000}s"
    if usec % 1000 == 0:
        return f"{usec // 1000}ms"
    return f"{usec}us"


def _in_template(exc: UnitFileError, path: Path, unit_name: str) -> UnitFileError:
    """Point a codec error at the template line that wrote the setting, where that is clear.

    The codec counts lines of the rendered text; blocks and loops shift them against the
    template. If exactly one template line starts with `Setting=`, that is the line to edit.
    """
    problem = exc.message.removeprefix(f"{exc.source}:{exc.line}: ")
    rendered = f"line {exc.line} of the text rendered for {unit_name}"
    hint = f"{exc.hint}; {rendered}" if exc.hint else rendered
    line = exc.line
    if exc.setting is not None:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            lines = []
        found = [
            n for n, text in enumerate(lines, 1) if text.lstrip().startswith(exc.setting + "=")
        ]
        if len(found) == 1:
            line = found[0]
    return UnitFileError(
        f"{path}:{line}: {problem}", hint, source=str(path), line=line, setting=exc.setting
    )


class _TrustedLoader(jinja2.BaseLoader):
    """Like jinja2's FileSystemLoader over `search_path`, reading only trusted files.

    Every directory but `builtin` is checked (`gpulaunch.units.trust`) when it exists, and
    a file found there is checked and read by `read_trusted`.
    """

    def __init__(self, search_path: Sequence[Path], builtin: Path, uid: int) -> None:
        self.search_path = tuple(search_path)
        self.builtin = builtin
        self.uid = uid
        self._checked: set[Path] = set()

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str, Callable[[], bool]]:
        pieces = jinja2.loaders.split_template_path(template)  # refuses "..": no escape
        for directory in self.search_path:
            path = directory.joinpath(*pieces)
            try:
                if directory == self.builtin:
                    if path.is_file():
                        return path.read_text(encoding="utf-8"), str(path), lambda: True
                    continue
                if not directory.is_dir():
                    continue
                if directory not in self._checked:
                    check_trusted(directory, self.uid, f"templates in {directory}")
                    self._checked.add(directory)
                if path.is_file():
                    return read_trusted(path, self.uid), str(path), lambda: True
            except OSError as exc:
                raise TemplateError(
                    f"cannot read templates in {directory}: {exc.strerror}",
                    "check the permissions of the directory and the ones above it",
                ) from None
        raise jinja2.TemplateNotFound(template)


def _finalize(value: object) -> object:
    """Applied to every `{{ ... }}`: a value must not be None or break a line."""
    if value is None:
        raise ValueError("a value is None; guard it with {% if ... is not none %}")
    if isinstance(value, str) and any(c in value for c in "\n\r"):
        raise ValueError(f"{value!r} contains a line break; use the systemd_text filter")
    return value


def _unit_names(context: Mapping[str, object]) -> JobUnitNames:
    """The job's unit names the templates were given (what the guarantees are checked by)."""
    return JobUnitNames(
        job_slice=str(context["job_slice"]),
        ranks_slice=str(context["ranks_slice"]),
        watcher_scope=str(context["watcher_scope"]),
    )


class Templates:
    """Finds, renders and parses unit templates."""

    def __init__(
        self,
        override_dirs: Sequence[Path] = (),
        *,
        environ: Mapping[str, str] | None = None,
        system_dir: Path = SYSTEM_DIR,
        builtin: Path | None = None,
        uid: int | None = None,
    ) -> None:
        """`environ` (for XDG_CONFIG_HOME and HOME) defaults to os.environ, `uid` (the
        invoking user: whose templates are trusted, and root gets no user directory) to
        the effective uid."""
        uid = os.geteuid() if uid is None else uid
        builtin = builtin_dir() if builtin is None else builtin
        user = () if uid == 0 else (user_dir(os.environ if environ is None else environ),)
        self.search_path: tuple[Path, ...] = (
            *(Path(d) for d in override_dirs),
            system_dir,
            *user,
            builtin,
        )
        self._env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            loader=_TrustedLoader(self.search_path, builtin, uid),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
            finalize=_finalize,
        )
        self._env.filters.update(
            systemd_text=systemd_text,
            systemd_quote=systemd_quote,
            systemd_word=systemd_word,
            specifier_escape=specifier_escape,
            timespan=timespan,
        )

    def find(self, template: str) -> Path:
        """The file `template` would be rendered from."""
        return Path(self._load(template).filename or template)

    def render(
        self, template: str, unit_name: str, context: Mapping[str, object]
    ) -> UnitDefinition:
        """Render `template` for the unit `unit_name` and convert it into properties.

        `template` is one of TEMPLATE_NAMES; its suffix says the unit type. `unit` in the
        context is set to `unit_name`.
        """
        if template not in TEMPLATE_NAMES:
            raise ValueError(f"unknown template {template!r}; expected one of {TEMPLATE_NAMES}")
        unit_type = template.rpartition(".")[2]
        if not unit_name.endswith("." + unit_type):
            raise ValueError(f"{unit_name!r} is not a {unit_type} unit, but {template} is")
        loaded = self._load(template)
        path = Path(loaded.filename or template)
        try:
            text = loaded.render({**context, "unit": unit_name})
        except Exception as exc:
            where = self._template_frame(exc)
            if where is None:
                raise
            what = exc.message if isinstance(exc, jinja2.TemplateError) else str(exc)
            what = " ".join((what or type(exc).__name__).split())
            hint = _CONTEXT_HINT
            if isinstance(exc, jinja2.exceptions.SecurityError):
                what = f"refused by the sandbox: {what}"
                hint = "templates may use their variables and filters, nothing of Python's"
            raise TemplateError(f"{where[0]}:{where[1]}: {what}", hint) from exc
        try:
            properties = parse_unit(text, unit_type, str(path))
            check_unit(template, properties, text, str(path), _unit_names(context))
        except UnitFileError as exc:
            raise _in_template(exc, path, unit_name) from exc
        return UnitDefinition(name=unit_name, template=path, text=text, properties=properties)

    def _load(self, template: str) -> jinja2.Template:
        try:
            return self._env.get_template(template)
        except jinja2.TemplateSyntaxError as exc:
            where = f"{exc.filename or exc.name or template}:{exc.lineno}"
            what = " ".join((exc.message or "").split())
            raise TemplateError(
                f"{where}: template syntax error: {what}",
                "see https://jinja.palletsprojects.com/en/stable/templates/",
            ) from exc
        except jinja2.TemplateNotFound as exc:
            searched = ", ".join(str(d) for d in self.search_path)
            raise TemplateError(
                f"template {exc.name} not found (searched {searched})",
                "reinstall gpulaunch, or put the file into a --units-dir directory",
            ) from exc

    def _template_frame(self, exc: BaseException) -> tuple[str, int] | None:
        """File and line of the innermost template code `exc` passed through, if any.

        jinja2 rewrites tracebacks so that template code shows as the template's file and line.
        """
        dirs = [os.path.join(os.path.abspath(d), "") for d in self.search_path]
        where = None
        tb: types.TracebackType | None = exc.__traceback__
        while tb is not None:
            filename = tb.tb_frame.f_code.co_filename
            if os.path.abspath(filename).startswith(tuple(dirs)):
                where = (filename, tb.tb_lineno)
            tb = tb.tb_next
        return where
