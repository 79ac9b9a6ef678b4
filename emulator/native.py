"""Compiled emulator modules: which hot modules are built with mypyc, where, and when they load.

Fixture mode must simulate a day of a 12-replica fleet (1.7M requests) in under two minutes,
which the pure-Python engine cannot do on its own. mypyc compiles the hot modules
(`NATIVE_MODULES`) from the same typed sources, with the same behaviour, about twice as fast.

The build never lands in the source tree. `python -m servewatch.emulator native build` copies the
package's sources, compiles the copy, and installs the extension modules in
`<sys.prefix>/servewatch-native/<key>/`, where the key hashes every source file of the package
(the compiled modules depend on the types of the others) and the interpreter's tag. On import,
`emulator/__init__.py` calls `activate`, which puts that folder first on the package's
`__path__` only if a complete build exists for the key of the sources as they are now. An
edited source changes the key, so a stale build can never shadow it: the emulator then runs
as pure Python until the next build. `SERVEWATCH_NATIVE=0` turns compiled modules off.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

PACKAGE = "servewatch.emulator"
PACKAGE_PATH = Path(*PACKAGE.split("."))  # where the package sits below a build's root
PACKAGE_DIR = Path(__file__).resolve().parent
NATIVE_MODULES = (
    "records",
    "engine",
    "workload",
    "fleet",
    "vllm_metrics",
    "dcgm_metrics",
    "otlp_jsonl",
)
"""The modules compiled, by measured benefit in fixture mode (docs/emulator.md)."""
DISABLE_ENV = "SERVEWATCH_NATIVE"  # "0": pure Python even when a build exists
DIR_ENV = "SERVEWATCH_NATIVE_DIR"  # where builds live instead of <sys.prefix>/servewatch-native
MANIFEST_NAME = "native.json"
_FORMAT = 1


@dataclass(frozen=True)
class NativeStatus:
    """Whether compiled modules are in use, and why (or why not)."""

    active: bool
    folder: Path
    reason: str


_status = NativeStatus(active=False, folder=Path(), reason="not activated")


def native_root() -> Path:
    configured = os.environ.get(DIR_ENV)
    return Path(configured) if configured else Path(sys.prefix) / "servewatch-native"


def source_key(package_dir: Path = PACKAGE_DIR) -> str:
    """Hash of every source file of the package, the compiled module list and the
    interpreter: a build is used only for exactly the sources it was made from."""
    digest = hashlib.sha256()
    digest.update(f"{_FORMAT}:{sys.implementation.cache_tag}:{','.join(NATIVE_MODULES)}".encode())
    for path in sorted(package_dir.glob("*.py")):
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def _extension_path(folder: Path, module: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = folder / f"{module}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def activate(package_path: list[str]) -> NativeStatus:
    """Put the current sources' build first on `package_path` (the package's `__path__`)
    when one exists; otherwise leave it alone. Never raises: pure Python is always there."""
    global _status  # noqa: PLW0603 (one activation per process, recorded for compiled_modules)
    folder = native_root()
    if os.environ.get(DISABLE_ENV) == "0":
        _status = NativeStatus(False, folder, f"{DISABLE_ENV}=0")
        return _status
    try:
        folder = folder / source_key()
        manifest = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
        shared = manifest.get("shared_lib")
        if shared:
            # The modules of one mypyc build share a library they import by a top-level
            # name; loading it by path keeps the build folder off sys.path.
            library = _extension_path(folder, shared)
            if library is None:
                raise ImportError(f"{folder}: shared library {shared} missing")
            spec = importlib.util.spec_from_file_location(shared, library)
            if spec is None or spec.loader is None:
                raise ImportError(f"{library}: not loadable")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[shared] = module
    except FileNotFoundError:
        _status = NativeStatus(False, folder, "no build for these sources")
        return _status
    except (OSError, ValueError, ImportError) as exc:
        _status = NativeStatus(False, folder, f"build unusable: {exc}")
        return _status
    package_path.insert(0, str(folder / PACKAGE_PATH))
    _status = NativeStatus(True, folder, "build matches the sources")
    return _status


def status() -> NativeStatus:
    return _status


def compiled_modules() -> tuple[str, ...]:
    """The emulator modules running compiled in this process (imports them to find out)."""
    compiled: list[str] = []
    for name in NATIVE_MODULES:
        module = importlib.import_module(f"{PACKAGE}.{name}")
        origin = getattr(module, "__file__", None) or ""
        if origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            compiled.append(name)
    return tuple(compiled)


def describe() -> str:
    """One line for reports: which implementation runs."""
    modules = compiled_modules()
    if modules:
        return f"emulator: compiled ({', '.join(modules)})"
    return f"emulator: pure Python ({_status.reason})"


class NativeBuildError(RuntimeError):
    """mypyc could not build the emulator's modules."""


def build(*, root: Path | None = None, quiet: bool = False) -> Path:
    """Compile `NATIVE_MODULES` from a copy of the current sources into `<root>/<key>/`;
    returns that folder (at once when it already holds a complete build)."""
    root = root or native_root()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=root) as tmp:
        src = Path(tmp) / "src"
        work = src / PACKAGE_PATH
        work.mkdir(parents=True)
        # The namespace package, empty: the emulator imports nothing else of the project.
        (src / PACKAGE_PATH.parent / "__init__.py").touch()
        for path in sorted(PACKAGE_DIR.glob("*.py")):
            shutil.copy2(path, work / path.name)
        # Keyed by the copy, not the tree: an edit made during the build lands elsewhere.
        key = source_key(work)
        target = root / key
        if (target / MANIFEST_NAME).is_file():
            return target
        started = time.monotonic()
        command = [
            sys.executable,
            "-m",
            "mypyc",
            *(str(PACKAGE_PATH / f"{name}.py") for name in NATIVE_MODULES),
        ]
        result = subprocess.run(  # noqa: S603 (our own interpreter, fixed arguments)
            command, cwd=src, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
            raise NativeBuildError(f"mypyc exited with {result.returncode}:\n{tail}")
        staged = Path(tmp) / "out"
        (staged / PACKAGE_PATH).mkdir(parents=True)
        for name in NATIVE_MODULES:
            extension = _extension_path(work, name)
            if extension is None:
                raise NativeBuildError(f"mypyc built no extension for {PACKAGE}.{name}")
            shutil.copy2(extension, staged / PACKAGE_PATH / extension.name)
        shared = [p for p in src.glob("*__mypyc.*") if p.suffix == ".so"]
        if len(shared) > 1:
            raise NativeBuildError(f"several shared libraries: {[p.name for p in shared]}")
        shared_name = shared[0].name.split(".")[0] if shared else None
        for library in shared:
            shutil.copy2(library, staged / library.name)
        manifest = {
            "format": _FORMAT,
            "key": key,
            "modules": list(NATIVE_MODULES),
            "shared_lib": shared_name,
            "python": sys.version,
            "built_s": round(time.monotonic() - started, 1),
        }
        (staged / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", "utf-8")
        try:
            staged.rename(target)
        except OSError:
            if not (target / MANIFEST_NAME).is_file():
                raise
    for old in root.iterdir():
        # Builds of other sources can never load again (the key guards them): drop them.
        if old.is_dir() and old != target and not old.name.startswith(".build-"):
            shutil.rmtree(old, ignore_errors=True)
    if not quiet:
        _say(f"emulator: compiled {', '.join(NATIVE_MODULES)} into {target}")
    return target


def _say(line: str, *, stream: TextIO | None = None) -> None:
    out = stream or sys.stdout
    out.write(line + "\n")
    out.flush()


def main(argv: list[str]) -> int:
    """`python -m servewatch.emulator native build|status` (emulator/__main__.py)."""
    usage = "usage: python -m servewatch.emulator native build|status"
    if argv == ["build"]:
        try:
            build()
        except (NativeBuildError, OSError) as exc:
            _say(f"emulator: native build failed, the emulator runs as pure Python: {exc}")
            return 1
        return 0
    if argv == ["status"]:
        _say(describe())
        return 0
    _say(usage, stream=sys.stderr)
    return 2
