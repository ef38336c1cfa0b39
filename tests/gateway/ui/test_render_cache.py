"""The Now page's shared rendering (gateway/ui/render_cache.py): one build for many viewers,
never an answer older than the change the viewer was told about, builds spaced and one at a
time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from trainsentry.gateway.ui.render_cache import RenderCache

REUSE_S = 0.3


class Builds:
    def __init__(self) -> None:
        self.started: list[float] = []
        self.running = 0
        self.most_at_once = 0

    def build(self, value: str, seconds: float = 0.05) -> Callable[[], Awaitable[str]]:
        async def run() -> str:
            self.started.append(time.monotonic())
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            await asyncio.sleep(seconds)
            self.running -= 1
            return value

        return run


async def test_many_viewers_at_one_marker_share_one_build() -> None:
    cache: RenderCache[str] = RenderCache(reuse_s=REUSE_S)
    builds = Builds()
    asked = cache.now()
    answers = await asyncio.gather(
        *(cache.get("all", (1, 1, 0), builds.build("page-1"), asked) for _ in range(12))
    )
    assert answers == ["page-1"] * 12 and len(builds.started) == 1
    # the same marker later: reused while it is fresh, built again after REUSE_S
    assert await cache.get("all", (1, 1, 0), builds.build("page-2"), cache.now()) == "page-1"
    await asyncio.sleep(REUSE_S)
    assert await cache.get("all", (1, 1, 0), builds.build("page-2"), cache.now()) == "page-2"


async def test_a_new_marker_gets_a_new_build_spaced_from_the_last() -> None:
    cache: RenderCache[str] = RenderCache(reuse_s=REUSE_S)
    builds = Builds()
    await cache.get("all", (1, 1, 0), builds.build("before"), cache.now())
    # the store changed: the viewer told so waits for a build that reads it, no sooner
    # than REUSE_S after the last one began, and viewers asking meanwhile share it
    asked = cache.now()
    answers = await asyncio.gather(
        *(cache.get("all", (2, 1, 0), builds.build(f"after-{i}"), asked) for i in range(5))
    )
    assert answers == ["after-0"] * 5
    assert len(builds.started) == 2
    assert builds.started[1] - builds.started[0] >= REUSE_S - 0.01


async def test_a_build_begun_after_a_viewer_asked_answers_it_whatever_its_marker() -> None:
    cache: RenderCache[str] = RenderCache(reuse_s=REUSE_S)
    builds = Builds()
    asked = cache.now()  # this viewer read marker (1, ...) ...
    await cache.get("all", (2, 1, 0), builds.build("newer"), cache.now())  # ... then this
    assert await cache.get("all", (1, 1, 0), builds.build("older"), asked) == "newer"
    assert len(builds.started) == 1


async def test_builds_for_different_filters_run_one_at_a_time() -> None:
    cache: RenderCache[str] = RenderCache(reuse_s=REUSE_S, max_builds=1)
    builds = Builds()
    asked = cache.now()
    answers = await asyncio.gather(
        *(cache.get(f"job-{i}", (1, 1, 0), builds.build(f"job-{i}"), asked) for i in range(6))
    )
    assert answers == [f"job-{i}" for i in range(6)]
    assert builds.most_at_once == 1 and len(builds.started) == 6


async def test_only_max_keys_renderings_are_kept() -> None:
    cache: RenderCache[str] = RenderCache(reuse_s=60, max_keys=3)
    builds = Builds()
    for i in range(5):
        await cache.get(f"job-{i}", (1, 1, 0), builds.build(f"job-{i}", 0), cache.now())
    await cache.get("job-0", (1, 1, 0), builds.build("again", 0), cache.now())
    assert len(builds.started) == 6  # job-0 was dropped, built again
    await cache.get("job-4", (1, 1, 0), builds.build("again", 0), cache.now())
    assert len(builds.started) == 6  # job-4 was kept
