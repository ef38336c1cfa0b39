"""Keeps the gateway's topology current: the static one from the config, or the Kubernetes
Node objects' labels, listed at start and every `refresh_seconds` (RBAC: list nodes).

Invariant: `current()` never blocks and never fails; a failed listing is logged and the last
good topology is kept (an empty one before the first success), so planning never waits on
the Kubernetes API. Parsing is pure (gateway/policy/topology.py, `from_node_labels`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from trainsentry.config.topology import MAX_NODES, TopologySettings
from trainsentry.gateway.policy.topology import Topology, from_node_labels, from_settings
from trainsentry.kube.client import Kube, LazyApiClient, RetryPolicy
from trainsentry.kube.resources import NODES
from trainsentry.tasks import OwnedTask

log = logging.getLogger("trainsentry.topology")

_PAGE = 500  # nodes per list call
_CALL_TIMEOUT_S = 30.0
_ONE_TRY = RetryPolicy(attempts=1)  # a failed listing waits for the next refresh


class TopologySource:
    def __init__(
        self,
        settings: TopologySettings,
        api_factory: Callable[[], Awaitable[Any]] | None = None,
        *,
        page_size: int = _PAGE,
    ) -> None:
        self.settings = settings
        self._page_size = page_size
        self._api = None if api_factory is None else LazyApiClient(api_factory)
        self._topology = from_settings(settings)
        self._task = OwnedTask("topology", self._run)
        self.refreshed = 0  # successful listings since start
        if settings.kubernetes and api_factory is None:
            raise ValueError("topology.kubernetes needs a Kubernetes API client")

    def current(self) -> Topology:
        return self._topology

    def start(self) -> None:
        if self.settings.kubernetes:
            self._task.start()

    async def stop(self) -> None:
        await self._task.stop()
        if self._api is not None:
            await self._api.close()

    async def refresh(self) -> Topology:
        """Lists the Node objects once and keeps their topology; raises what failed."""
        assert self._api is not None
        kube = Kube(await self._api.get(), _ONE_TRY, timeout_s=_CALL_TIMEOUT_S)
        named: list[tuple[str, dict[str, str], dict[str, str]]] = []
        token: str | None = None
        while len(named) < MAX_NODES:
            page, token = await kube.list_page(NODES, limit=self._page_size, token=token)
            for node in page:
                meta = node.get("metadata") or {}
                named.append(
                    (
                        str(meta.get("name") or ""),
                        dict(meta.get("labels") or {}),
                        dict(meta.get("annotations") or {}),
                    )
                )
            if not token:
                break
        self._topology = from_node_labels(self.settings, named)
        self.refreshed += 1
        return self._topology

    async def _run(self) -> None:
        while True:
            try:
                topology = await self.refresh()
                log.info("topology: %d nodes placed", len(topology))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API may be down; keep the last good topology
                log.warning("topology: listing nodes failed, keeping the last one: %r", exc)
            await asyncio.sleep(self.settings.refresh_seconds)
