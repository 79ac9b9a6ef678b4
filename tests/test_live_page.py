"""The live page is rebuilt when the store moves on, not per request."""

from __future__ import annotations

from collections.abc import Hashable

from servewatch.live_page import BuiltPage, LivePage


def test_the_page_is_rebuilt_only_when_the_store_moved() -> None:
    builds: list[Hashable] = []

    def build(key: Hashable) -> BuiltPage:
        builds.append(key)
        return BuiltPage(html=f"<p>{key}</p>", specs={}, key=key)

    page = LivePage(build)
    page.moved("w1")
    first = page.page()
    assert page.page() is first  # asked again: the kept page
    page.moved("w1")  # an evaluation that found nothing new
    assert page.page() is first
    page.moved("w2")
    second = page.page()
    assert second.html == "<p>w2</p>"
    assert second.etag != first.etag
    assert builds == ["w1", "w2"]
    assert page.builds_key == "w2"
