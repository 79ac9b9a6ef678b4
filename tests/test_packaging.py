"""The wheel claims one top-level name: every room installs below `servewatch`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT


def tracked_tree(destination: Path) -> Path:
    """A copy of the tracked files (links kept as links), so the build writes nothing here."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = REPO_ROOT / os.fsdecode(name)
        target = destination / os.fsdecode(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(source.readlink())
        elif source.is_file():  # a file deleted but not yet staged is skipped
            shutil.copy2(source, target)
    return destination


@pytest.mark.slow  # builds a wheel
def test_the_wheel_installs_only_the_servewatch_package(tmp_path: Path) -> None:
    tree = tracked_tree(tmp_path / "tree")
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--wheel-dir", str(wheels), str(tree)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("servewatch-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top = {name.split("/")[0] for name in names}
    assert {name for name in top if not name.endswith(".dist-info")} == {"servewatch"}
    for module in (
        "store/store.py",
        "pipeline/tables.py",
        "slo/burn_windows.toml",
        "emulator/engine.py",
        "cli/app.py",
    ):
        assert f"servewatch/{module}" in names

    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
         "--target", str(site), str(wheel)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    assert {path.name for path in site.iterdir() if not path.name.endswith(".dist-info")} == {
        "servewatch",
        "bin",
    }
    # The installed copy imports on its own: -S keeps this environment's editable install
    # (a .pth hook) out, the dependencies come from its site-packages.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), sysconfig.get_paths()["purelib"]]),
    }
    probe = subprocess.run(
        [sys.executable, "-S", "-c",
         "import servewatch.cli, servewatch.store as s; print(s.__file__)"],
        capture_output=True, text=True, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert Path(probe.stdout.strip()).is_relative_to(site)
