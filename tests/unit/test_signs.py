"""Signs that tell the truth: what the package's docstrings and the docs say of the code
is checked against the code, so that a sign cannot go stale unnoticed (issue 34).

- every package docstring (`gpulaunch/<package>/__init__.py`) names exactly its modules,
  each as a word `name.py` (a path such as `watcher/loop.py` is a citation, not a name);
- every file a module, a test or a document cites (`supervisor/direct.py`,
  `docs/recovery.md`, `systemd-facts.md`) is in the repository;
- docs/architecture.md's drawing of the layers is pyproject.toml's contract.
"""

from __future__ import annotations

import ast
import os
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpulaunch"
PACKAGES = sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))

# `loop.py`, never `watcher/loop.py` or `gpulaunch.units.codec`: a module of this package
MODULE_WORD = re.compile(r"(?<![\w/.-])([A-Za-z_]\w*)\.py\b")


def named_modules(docstring: str) -> set[str]:
    return {m.group(1) for m in MODULE_WORD.finditer(docstring)}


def test_a_module_word_is_told_from_a_path() -> None:
    text = "`loop.py` and eventloop.py, not watcher/loop.py, gpulaunch/seen.py or a.b.py"
    assert named_modules(text) == {"loop", "eventloop"}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_a_package_docstring_names_exactly_its_modules(package: Path) -> None:
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    named = named_modules(docstring)
    assert {"missing": modules - named, "gone": named - modules} == {
        "missing": set(),
        "gone": set(),
    }, f"gpulaunch/{package.name}/__init__.py: name each module as `name.py`"


# -- citations ------------------------------------------------------------------------

CITING = (".py", ".md", ".sh", ".toml", ".service", ".scope", ".slice", ".txt", ".yml")
URL = re.compile(r"\w+://\S+")
# a path with at least one folder: `supervisor/direct.py`, `../shared/notes/x.md`
CITED_PATH = re.compile(r"(?<![\w./~$<>{}-])((?:\.\./)*(?:[\w.-]+/)+[\w-]+\.(?:py|md))\b")
# a document by its name alone: `systemd-facts.md` (not a file name in quotes: code)
CITED_DOC = re.compile(r"(?<![\w./~$<>{}\"'-])([\w-]+\.md)\b")
# a module by its name alone, in the package and the docs: `jobctl.py` (once a module)
CITED_MODULE = re.compile(r"(?<![\w./~$<>{}\"'-])([\w-]+\.py)\b")
BY_NAME_ALONE = ("gpulaunch/", "docs/", "README.md")
EXAMPLES = {"train.py", "script.py"}  # the user's training script, in examples
# Named, with why, the citations that are not of this repository's files:
NOT_OURS = (
    "torch/",  # torch's own sources (torch/distributed/run.py)
    "elastic/",  # torch/distributed/elastic/..., cited from its folder down
    "lightning/",  # Lightning's sources
    "rich/",  # rich's sources (its terminal width)
    "bench/.scratch/",  # what a script writes, not what it reads
)
NOT_CHECKED = (
    "bench/results/",  # measurements: each records the tree of its date, never edited
    "tests/unit/test_signs.py",  # this file: its examples
)


def repository_files() -> list[str]:
    found = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        rel = Path(top).relative_to(ROOT)
        found.extend(str(rel / f) if str(rel) != "." else f for f in files)
    return found


def cited_files(text: str, modules: bool = False) -> list[tuple[int, str]]:
    """(line, path) of every file a text cites; URLs cite nothing here. `modules`: a
    module named alone (`loop.py`) is a citation too."""
    found = []
    for number, line in enumerate(URL.sub("", text).splitlines(), 1):
        found += [(number, m.group(1)) for m in CITED_PATH.finditer(line)]
        found += [(number, m.group(1)) for m in CITED_DOC.finditer(line)]
        if modules:
            found += [(number, m.group(1)) for m in CITED_MODULE.finditer(line)]
    return [(n, c) for n, c in found if c not in EXAMPLES]


def test_a_citation_is_told_from_other_text() -> None:
    text = "see supervisor/direct.py, ../shared/notes/x.md and facts.md; https://a.b/c/d.py"
    assert cited_files(text + '\nwrite(tmp / "out.md")') == [
        (1, "supervisor/direct.py"),
        (1, "../shared/notes/x.md"),
        (1, "facts.md"),
    ]
    assert cited_files("run by jobctl.py; `python train.py`", modules=True) == [(1, "jobctl.py")]


def test_every_cited_file_is_in_the_repository() -> None:
    """A citation of a file that is not here (a deleted module, a note outside the
    repository) sends a reader nowhere: each must name a file of this repository, by a
    path that ends one (`watcher/loop.py` for gpulaunch/watcher/loop.py)."""
    files = repository_files()
    names = {f.rsplit("/", 1)[-1] for f in files}
    paths = set(files)
    missing = []
    for rel in files:
        if not rel.endswith(CITING) or rel.startswith(NOT_CHECKED):
            continue
        text = (ROOT / rel).read_text(errors="replace")
        for number, cited in cited_files(text, rel.startswith(BY_NAME_ALONE)):
            if cited.startswith(NOT_OURS) or re.search(r"\b[A-Z]+\.py$", cited):
                continue  # another project's file, or a placeholder (bench/ranks/SCRIPT.py)
            if "/" not in cited:
                found = cited in names
            else:
                bare = re.sub(r"^(\.\./)+", "", cited)
                found = bare in paths or any(f.endswith("/" + bare) for f in files)
            if not found:
                missing.append(f"{rel}:{number}: {cited}")
    assert missing == []


# -- the layers -----------------------------------------------------------------------


def drawn_layers() -> list[str]:
    """docs/architecture.md's drawing under "### The layers": one rung a line, its
    folders before the first run of two spaces, `|` between side-by-side folders."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("### The layers", 1)[1]
    drawing = section.split("```", 2)[1]
    return [re.split(r"\s{2,}", line.strip())[0] for line in drawing.strip().splitlines()]


def test_the_layer_drawing_is_the_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    rungs = [
        " | ".join(m.strip().removeprefix("gpulaunch.") for m in layer.split("|"))
        for layer in contract["layers"]
    ]
    assert drawn_layers() == rungs


# -- the module map ---------------------------------------------------------------------


def module_map() -> dict[str, str]:
    """docs/architecture.md's "## The modules": each entry (`watcher/`, `cli.py`) and its
    words, continuation lines included."""
    section = (ROOT / "docs" / "architecture.md").read_text().split("## The modules", 1)[1]
    entries: dict[str, str] = {}
    current = ""
    for line in section.split("```", 2)[1].splitlines():
        if line and not line[0].isspace():
            current, _, line = line.partition(" ")
            entries[current] = ""
        if current:
            entries[current] += " " + line.strip()
    return entries


def test_the_module_map_names_every_module() -> None:
    """Each module of the package is in the map: a top-level module as its own entry, a
    folder's module as a word of its folder's entry."""
    entries = module_map()
    missing = [p.name for p in PACKAGE.glob("*.py") if p.name not in entries]
    missing.remove("__init__.py")
    for package in PACKAGES:
        words = set(re.findall(r"\w+", entries.get(f"{package.name}/", "")))
        modules = {p.stem for p in package.glob("*.py")} - {"__init__"}
        missing += [f"{package.name}/{m}.py" for m in sorted(modules - words)]
    gone = [e for e in entries if e.endswith("/") and not (PACKAGE / e).is_dir()]
    gone += [e for e in entries if e.endswith(".py") and not (PACKAGE / e).is_file()]
    assert {"missing": missing, "gone": gone} == {"missing": [], "gone": []}


# -- tests ------------------------------------------------------------------------------


def test_no_test_module_imports_another() -> None:
    """What tests share lives in a module that is not a test module (tests/unit/fakes.py,
    tests/integration/shared.py and jobs.py, tests/gpu/helpers.py, tests/vm/vmjobs.py):
    a test module's name says what it tests, never what others need of it."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = []
            if isinstance(node, ast.ImportFrom):
                modules = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            if any(m.rsplit(".", 1)[-1].startswith("test_") for m in modules):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
