"""Compiled emulator modules load only for the exact sources they were built from."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.emulator import native
from tests.conftest import REPO_ROOT


def test_the_emulator_says_which_implementation_runs() -> None:
    compiled = native.compiled_modules()
    status = native.status()
    assert set(compiled) <= set(native.NATIVE_MODULES)
    complete_build = (native.native_root() / native.source_key() / native.MANIFEST_NAME).is_file()
    if status.active:
        # A build for these very sources was found: every module it holds runs compiled.
        assert complete_build
        assert compiled == native.NATIVE_MODULES
        assert native.describe() == f"emulator: compiled ({', '.join(compiled)})"
    else:
        assert compiled == ()
        assert native.describe() == f"emulator: pure Python ({status.reason})"
        if complete_build:
            assert status.reason == f"{native.DISABLE_ENV}=0"


def test_the_key_follows_every_source_file(tmp_path: Path) -> None:
    copy = tmp_path / "emulator"
    shutil.copytree(native.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    key = native.source_key(copy)
    assert key == native.source_key(native.PACKAGE_DIR)
    # Not only the compiled modules: they are built against the types of all the others.
    records = copy / "records.py"
    records.write_text(records.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    assert native.source_key(copy) != key


def fake_build(root: Path, key: str) -> Path:
    folder = root / key
    (folder / native.PACKAGE_PATH).mkdir(parents=True)
    (folder / native.MANIFEST_NAME).write_text(json.dumps({"shared_lib": None}), "utf-8")
    return folder


def test_activate_uses_only_a_complete_build_of_the_current_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(native.DIR_ENV, str(tmp_path))
    monkeypatch.delenv(native.DISABLE_ENV, raising=False)
    monkeypatch.setattr(native, "_status", native.status())  # restored after the test
    path = ["/src/emulator"]

    fake_build(tmp_path, "0" * 20)  # a build of other (older) sources
    (tmp_path / native.source_key() / native.PACKAGE_PATH).mkdir(parents=True)  # unfinished
    assert not native.activate(path).active
    assert path == ["/src/emulator"]
    assert native.status().reason == "no build for these sources"

    current = tmp_path / native.source_key()
    (current / native.MANIFEST_NAME).write_text(json.dumps({"shared_lib": "gone__mypyc"}), "utf-8")
    assert not native.activate(path).active
    assert "shared library gone__mypyc missing" in native.status().reason
    assert path == ["/src/emulator"]

    (current / native.MANIFEST_NAME).write_text(json.dumps({"shared_lib": None}), "utf-8")
    assert native.activate(path).active
    assert path == [str(current / native.PACKAGE_PATH), "/src/emulator"]

    monkeypatch.setenv(native.DISABLE_ENV, "0")
    again = ["/src/emulator"]
    assert not native.activate(again).active
    assert again == ["/src/emulator"]


def test_status_command_and_usage() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "servewatch.emulator", "native", "status"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("emulator: ")
    bad = subprocess.run(
        [sys.executable, "-m", "servewatch.emulator", "native", "compile"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert "usage: python -m servewatch.emulator native build|status" in bad.stderr


@pytest.mark.slow  # the recording computes its ground truth: a capacity search
def test_emulate_record_says_which_implementation_runs(tmp_path: Path, runner: CliRunner) -> None:
    folder = tmp_path / "recording"
    result = runner.invoke(app, ["emulate", "--record", str(folder), "--hours", "0.02", "--json"])
    assert result.exit_code == 0, result.output
    assert native.describe() in result.stderr
    assert json.loads(result.stdout)["requests"] > 0
