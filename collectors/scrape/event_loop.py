"""The event loop scrapes run on: uvloop's where it is installed, else asyncio's own.

A scrape is a few turns of the event loop (write the request, wake on the head, wake on the
body); at one scrape a second per target those turns cost more of the scrape loop's CPU than
the page does, and uvloop's turns cost less than asyncio's (`bench scrape_cost`, see
docs/benchmarks.md). Both run the same code to the same results; `SERVEWATCH_EVENT_LOOP=asyncio`
chooses asyncio's own loop, `uvloop` insists on uvloop.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
CHOICE = "SERVEWATCH_EVENT_LOOP"
LOOPS = ("uvloop", "asyncio")


class EventLoopError(RuntimeError):
    """The event loop asked for cannot be had."""


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of the chosen kind (uvloop's by default, when installed)."""
    chosen = os.environ.get(CHOICE, "").strip().lower()
    if chosen not in ("", *LOOPS):
        raise EventLoopError(f"{CHOICE}={chosen!r}: choose one of {', '.join(LOOPS)}")
    if chosen != "asyncio":
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError as exc:
            if chosen == "uvloop":
                raise EventLoopError(f"{CHOICE}=uvloop, but uvloop is not installed") from exc
        else:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
    return asyncio.new_event_loop()


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on a new event loop of the chosen kind."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coroutine)
