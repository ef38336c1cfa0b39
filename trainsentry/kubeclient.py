"""One way to reach the Kubernetes API from the gateway: the pod's service account when
running in a cluster, else the local kubeconfig. Created lazily, on first use."""

from __future__ import annotations

from typing import Any


async def default_api_client() -> Any:
    from kubernetes_asyncio import client, config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        await config.load_kube_config()
    return client.ApiClient()
