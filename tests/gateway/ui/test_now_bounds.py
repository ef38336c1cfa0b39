"""The Now page draws a bounded number of cards, the most urgent first, and counts the rest
(issue 32 finding 11), on SQLite and PostgreSQL: an old P0 is drawn though many newer
alerts are open (the page once drew the newest 5,000 whatever their priority), the totals,
each job's count and the filter choices cover every open alert, and the page says how many
it does not draw, with a link to the job's own list. The job's page draws its newest."""

from __future__ import annotations

import re

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.gateway.ui.helpers import alert, post_alerts, start
from tests.support.gateway_process import close_in_process
from trainsentry.gateway.ui import handlers


async def page_of(server: TestServer, path: str) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(server.make_url(path)) as answer:
            assert answer.status == 200, path
            return await answer.text()


def drawn(page: str) -> list[str]:
    return re.findall(r'data-alert-id="(\d+)"', page)


async def test_the_most_urgent_are_drawn_and_the_rest_counted(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handlers, "MAX_CARDS", 3)
    server = await start(db_url)
    try:
        await post_alerts(
            server,
            [
                alert(1, priority="P0", trainingjob="job-a"),  # the oldest
                *(alert(i, priority="P3", trainingjob="job-a") for i in range(2, 7)),
                alert(7, priority="P2", trainingjob="job-b", component="gpu"),
            ],
        )
        for path in ("/ui/", "/ui/fragments/now"):
            page = await page_of(server, path)
            assert drawn(page) == ["1", "6", "7"], path
            assert "7 open" in page and "P3 5" in page and "P0 1" in page
            assert "the most urgent 3 are drawn, and 4 more" in page
            assert "6 open, 6 not acked" in page  # job-a, two of its cards drawn
            assert "and 4 more not drawn" in page
            assert "/ui/?namespace=ml&amp;job=job-a" in page
        page = await page_of(server, "/ui/")
        assert "<option>gpu</option>" in page and "<option>job-b</option>" in page
        # a filter narrows what is counted and drawn, in the store
        page = await page_of(server, "/ui/?job=job-a&priority=P3")
        assert drawn(page) == ["6", "5", "4"] and "5 open" in page
        page = await page_of(server, "/ui/?component=gpu")
        assert drawn(page) == ["7"] and "1 open" in page and "more" not in page
        # the job's page: the newest drawn, its hardware counted over all of them
        page = await page_of(server, "/ui/job?namespace=ml&name=job-a&days=56")
        assert drawn(page) == ["6", "5", "4"]
        assert "Alert history (6, the newest 3 drawn)" in page
    finally:
        await close_in_process(server)
