"""Fields of configuration files read with their path for errors: SLO files (YAML specs, the
TOML window table) here, and, through subclasses naming their own error and words, the capacity
requirement and `servewatch.toml`.

Every error names the file, the dotted path of the bad field, what was found and what is
allowed; unknown keys are errors, because a misspelt field silently ignored changes who gets
paged.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar, overload

from servewatch.slo.durations import parse_duration_s

E = TypeVar("E", bound=Enum)


def read_text(path: Path, *, error: type[ValueError], language: str) -> str:
    """The UTF-8 text of a configuration file; raises `error` naming the file when it cannot be
    read, or the line of the first byte that is not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise error(f"{path}: line {line}: not UTF-8 text ({language} files are UTF-8)") from exc


def read_toml(path: Path, *, error: type[ValueError]) -> dict[str, Any]:
    """The tables of a TOML file, with `read_text`'s errors and TOML's own (line and column)."""
    text = read_text(path, error=error, language="TOML")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML: {exc}") from exc


class SpecError(ValueError):
    """An SLO file cannot be used; the message says which file, which field and why."""


class Fields:
    """One mapping of a file being read; remembers which keys were read for `done()`.

    Subclasses set `error` (the exception raised), and the words their files use for a mapping
    and a key (TOML says table and setting)."""

    error: ClassVar[type[ValueError]] = SpecError
    mapping_word: ClassVar[str] = "mapping"
    key_word: ClassVar[str] = "field"

    def __init__(self, data: Mapping[str, Any], *, where: str, path: str = "") -> None:
        self.data = data
        self.where = where
        self.path = path
        self.read: set[str] = set()

    @classmethod
    def of(cls, value: object, *, where: str, path: str) -> Self:
        """Fields of `value`, which must be a mapping (the error names `path` otherwise)."""
        if not isinstance(value, Mapping):
            found = type(value).__name__ if value is not None else "nothing"
            raise cls.error(
                f"{where}: {path or 'document'}: must be a {cls.mapping_word}, got {found}"
            )
        return cls(value, where=where, path=path)

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, message: str) -> ValueError:
        return self.error(f"{self.where}: {self.name(key)}: {message}")

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str) -> Any:
        self.read.add(key)
        return self.data.get(key)

    def required(self, key: str, what: str) -> Any:
        value = self.raw(key)
        if value is None:
            raise self.fail(key, f"is required ({what})")
        return value

    @overload
    def text(self, key: str, *, default: str) -> str: ...
    @overload
    def text(self, key: str, *, default: None = None) -> str | None: ...
    def text(self, key: str, *, default: str | None = None) -> str | None:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"must be a non-empty string, got {value!r}")
        return value.strip()

    def number(self, key: str) -> float | None:
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise self.fail(key, f"must be a number, got {value!r}")
        return float(value)

    def positive_number(self, key: str, *, default: float) -> float:
        value = self.number(key)
        if value is None:
            return default
        if not value > 0:
            raise self.fail(key, f"must be a positive number, got {self.data[key]!r}")
        return value

    def flag(self, key: str, *, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def strings(self, key: str) -> tuple[str, ...] | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(key, f"must be a list of non-empty strings, got {value!r}")
        return tuple(value)

    def positive_whole(self, key: str, *, default: int) -> int:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(key, f"must be a positive whole number, got {value!r}")
        return value

    def positive_wholes(self, key: str) -> tuple[int, ...]:
        value = self.raw(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
        ):
            raise self.fail(key, f"must be a list of positive whole numbers, got {value!r}")
        return tuple(value)

    def whole(self, key: str, *, default: int, minimum: int) -> int:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"must be a whole number >= {minimum}, got {value!r}")
        return value

    def choice(self, key: str, enum: type[E], *, default: E | None = None) -> E:
        value = self.raw(key)
        if value is None:
            if default is None:
                raise self.fail(key, f"is required; allowed: {_values(enum)}")
            return default
        try:
            return enum(value)
        except ValueError as exc:
            raise self.fail(key, f"is {value!r}; allowed: {_values(enum)}") from exc

    def duration_s(
        self, key: str, *, default_s: int | None = None, minute: bool = True, zero: bool = False
    ) -> int:
        """A Prometheus-style duration (5m, 1h, 3d) in seconds; whole minutes unless told."""
        value = self.raw(key)
        if value is None:
            if default_s is None:
                raise self.fail(key, "is required (a duration such as 5m, 1h or 3d)")
            return default_s
        if zero and str(value).strip() in {"0", "0s", "0m"}:
            return 0
        try:
            seconds = parse_duration_s(str(value))
        except ValueError as exc:
            raise self.fail(key, str(exc)) from exc
        if minute and seconds % 60:
            raise self.fail(
                key, f"is {value!r}; must be a whole number of minutes (burn rates use minutes)"
            )
        return seconds

    def mapping(self, key: str) -> Self | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.fail(key, f"must be a {self.mapping_word}, got {type(value).__name__}")
        return type(self)(value, where=self.where, path=self.name(key))

    def table(self, key: str) -> Self:
        """Like `mapping`, but a missing one reads as empty (every field at its default)."""
        found = self.mapping(key)
        return type(self)({}, where=self.where, path=self.name(key)) if found is None else found

    def string_map(self, key: str) -> dict[str, str]:
        value = self.raw(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str | int | float) and not isinstance(v, bool)
            for k, v in value.items()
        ):
            raise self.fail(key, f"must be a mapping of names to strings, got {value!r}")
        return {k: str(v) for k, v in value.items()}

    def items(self, key: str, *, required: bool = False) -> list[Self]:
        """The mappings of a list field, each with its indexed path (`slos[2]`)."""
        value = self.raw(key)
        if value is None:
            if required:
                raise self.fail(key, "is required (a list)")
            return []
        if not isinstance(value, Sequence) or isinstance(value, str):
            raise self.fail(key, f"must be a list, got {type(value).__name__}")
        return [
            self.of(item, where=self.where, path=f"{self.name(key)}[{i}]")
            for i, item in enumerate(value)
        ]

    def done(self) -> None:
        unknown = sorted(str(k) for k in set(self.data) - self.read)
        if unknown:
            allowed = ", ".join(sorted(self.read))
            raise self.fail(unknown[0], f"unknown {self.key_word}; allowed here: {allowed}")


def _values(enum: type[Enum]) -> str:
    return ", ".join(str(member.value) for member in enum)
