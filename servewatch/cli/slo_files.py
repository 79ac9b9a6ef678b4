"""The SLOs a reading command holds the window to: those of --slo, else of the config's [slo]
files (--config, or ./servewatch.toml when present)."""

from __future__ import annotations

from pathlib import Path

from servewatch.cli.app import DEFAULT_DB, EXIT_BAD_INPUT, CliState, fail, load_config_or_fail
from servewatch.render import err_console, labelled
from servewatch.slo.fields import SpecError
from servewatch.slo.spec import SloSpec
from servewatch.slo_service import SloSetupError, load_specs

# Read when neither --slo nor --config is given, as `run` and `scrape` read it.
DEFAULT_CONFIG = Path("servewatch.toml")


def slo_specs(
    state: CliState,
    slo_files: list[Path] | None,
    config_path: Path | None,
    *,
    required: bool = False,
) -> tuple[SloSpec, ...]:
    """The SLOs of --slo, else of the config's [slo] files (./servewatch.toml when present
    and not `required`); none when neither names any, an error naming both when `required`.
    A config read here also names the store when --db was left at its default."""
    paths = list(slo_files or [])
    if not paths:
        default = None if required or not DEFAULT_CONFIG.is_file() else DEFAULT_CONFIG
        path = config_path or default
        if path is not None:
            config = load_config_or_fail(path)
            paths = list(config.slo.files)
            if state.db == DEFAULT_DB:
                state.db = config.store_path
    if not paths and not required:
        return ()
    try:
        specs, notes = load_specs(paths)
    except (SloSetupError, SpecError) as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    for note in notes:
        err_console.print(labelled("note:", note))
    return specs
