"""The VM lab's pure logic (sdbox/vm/): the recipe's hash, the cache, stale runs, the
accelerator choice. Building and booting are proven by tests/vm itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sdbox.vm import image, machine


def test_recipe_hash_follows_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    first = image.recipe_hash()
    assert first == image.recipe_hash() and len(first) == 16
    monkeypatch.setattr(image, "PACKAGES", (*image.PACKAGES, "strace"))
    assert image.recipe_hash() != first


def test_an_image_is_cached_only_once_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image, "ROOT", tmp_path)
    assert image.cached() is None
    built = tmp_path / image.recipe_hash()
    built.mkdir()
    assert image.cached() is None  # a build still under way (or killed) is not an image
    (built / "done").write_text("built\n")
    found = image.cached()
    assert found is not None and found.disk == built / "root.img"


def test_stale_runs_are_removed_live_and_new_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(machine, "ROOT", tmp_path)
    dead = tmp_path / "run-dead"
    dead.mkdir()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    (dead / "qemu.pid").write_text(f"{pid}\n")  # gone: its qemu is not running
    new = tmp_path / "run-new"
    new.mkdir()  # being set up: no pid file yet, young
    old = tmp_path / "run-old"
    old.mkdir()
    os.utime(old, (1, 1))  # no pid file and old: a setup that died
    assert sorted(p.name for p in machine.clean_stale_runs()) == ["run-dead", "run-old"]
    assert new.exists() and not dead.exists() and not old.exists()


def test_accelerators(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "ROOT", tmp_path)
    monkeypatch.setenv("SDBOX_VM_ACCEL", "tcg")
    assert machine.choose_accels() == ["tcg"]
    monkeypatch.delenv("SDBOX_VM_ACCEL")
    kvm = os.access("/dev/kvm", os.R_OK | os.W_OK)
    assert machine.choose_accels() == (["kvm", "tcg"] if kvm else ["tcg"])
    (tmp_path / "kvm-verdict").write_text("hangs\n")
    assert machine.choose_accels() == ["tcg"]  # tried once: not again


def test_a_qemu_that_fails_at_once_is_not_booted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KVM on these machines: qemu prints its error and exits at once. Its console closing
    woke the boot wait, and poll() could still see it running: "booted (kvm) in 0 s", the
    verdict "boots" written, and every later ssh refused."""
    fake = tmp_path / "bin" / "qemu-system-x86_64"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'qemu-system-x86_64: error: failed to set MSR 0x10a'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    vm = machine.Machine(image=image.Image(tmp_path), log=False)
    vm.state = tmp_path
    for _ in range(20):  # the race was lost often but not always
        assert vm._boot("kvm", tmp_path / "overlay", None, timeout=30) is False
        vm._kill()
