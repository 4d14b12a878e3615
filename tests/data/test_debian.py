"""The shared locator of Debian-backed corpora: every branch of DebianFiles.locate / fetch."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from test_corpus import make_deb

from leechq.data import debian
from leechq.data.debian import DebianFiles
from leechq.errors import ArtifactError
from leechq.utils.hashing import sha256_file

TOY = DebianFiles(
    package="toy-pkg", corpus="toy", sub="src", prefix="usr/share/toy/", suffix=".txt",
    skip=("private/",), fetch_name="tests.fetch_toy", layout="usr/share/toy", what="texts",
)
_FILES = {
    "./usr/share/toy/a.txt": b"alpha",
    "./usr/share/toy/sub/b.txt": b"beta",
    "./usr/share/toy/c.bin": b"not taken (suffix)",
    "./usr/share/toy/private/d.txt": b"not taken (skip)",
    "./usr/share/other/e.txt": b"not taken (prefix)",
}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LEECHQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LEECHQ_CORPUS_DIR", raising=False)
    return tmp_path


def _taken(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_override_then_system_then_cache(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = env / "installed"
    system.mkdir()
    assert TOY.locate(fetch=False, system=system) == system
    (env / "mine" / "toy").mkdir(parents=True)
    monkeypatch.setenv("LEECHQ_CORPUS_DIR", str(env / "mine"))
    assert TOY.locate(fetch=False, system=system) == env / "mine" / "toy"  # override wins
    monkeypatch.setenv("LEECHQ_CORPUS_DIR", str(env / "nope"))
    with pytest.raises(ArtifactError, match=r"LEECHQ_CORPUS_DIR=.*has no toy/ directory"):
        TOY.locate(system=system)  # a set variable never falls through to other places
    monkeypatch.delenv("LEECHQ_CORPUS_DIR")
    cached = TOY.cache_dir() / "src"
    cached.mkdir(parents=True)
    with pytest.raises(ArtifactError, match="no copy"):  # a folder without manifest is no copy
        TOY.locate(fetch=False)
    (TOY.cache_dir() / debian.MANIFEST).write_text("{}")
    assert TOY.locate(fetch=False, system=env / "absent") == cached


def test_no_copy_names_package_places_and_offline_routes(env: Path) -> None:
    with pytest.raises(ArtifactError) as err:
        TOY.locate(fetch=False, system=env / "absent")
    msg = str(err.value)
    assert msg.startswith(f"no copy of the toy-pkg texts: not installed at {env / 'absent'}, "
                          f"not cached at {TOY.cache_dir()}; call fetch_toy(), or download ")
    assert "toy-pkg_*.deb" in msg and "tests.fetch_toy(deb=PATH)" in msg
    assert "$LEECHQ_CORPUS_DIR" in msg and "toy/ laid out like usr/share/toy" in msg
    with pytest.raises(ArtifactError) as err:
        TOY.locate(fetch=False)
    assert ": not cached at " in str(err.value) and "installed" not in str(err.value)


def test_fetch_from_a_local_deb_takes_the_declared_members(env: Path) -> None:
    deb = make_deb(env / "toy-pkg_1_all.deb", _FILES, version="1.2-3")
    root = TOY.fetch(deb)
    assert root == TOY.cache_dir() / "src" == TOY.locate(fetch=False)
    assert _taken(root) == ["a.txt", "sub/b.txt"]
    manifest = json.loads((TOY.cache_dir() / debian.MANIFEST).read_text())
    assert manifest == {"package": "toy-pkg", "deb": deb.name, "version": "1.2-3",
                        "deb_sha256": sha256_file(deb)}
    assert deb.exists()
    assert [p.name for p in TOY.cache_dir().parent.iterdir()] == ["toy-pkg"]  # no temp left


def _fake_apt_get(bin_dir: Path, script: str) -> None:
    bin_dir.mkdir()
    tool = bin_dir / "apt-get"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


def test_locate_fetches_with_apt_get_and_removes_the_download(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deb = make_deb(env / "prepared.deb", _FILES, version="9")
    _fake_apt_get(env / "bin", f'cp "{deb}" "./$2_9_all.deb"\n')
    monkeypatch.setenv("PATH", f"{env / 'bin'}{os.pathsep}{os.environ['PATH']}")
    root = TOY.locate()
    assert _taken(root) == ["a.txt", "sub/b.txt"]
    assert json.loads((TOY.cache_dir() / debian.MANIFEST).read_text())["deb"] == "toy-pkg_9_all.deb"
    assert not list(TOY.cache_dir().rglob("*.deb"))


def test_apt_get_failure_names_the_package_and_leaves_nothing(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_apt_get(env / "bin", 'echo "E: Unable to locate package $2" >&2\nexit 100\n')
    monkeypatch.setenv("PATH", f"{env / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ArtifactError,
                       match=r"apt-get download toy-pkg failed \(exit 100\): E: Unable to locate "
                             r"package toy-pkg; download toy-pkg_\*\.deb"):
        TOY.locate()
    assert not TOY.cache_dir().exists() and not list(TOY.cache_dir().parent.iterdir())
