"""One set of credentials for the whole operator: kopf's watches and our own API client.

kopf's built-in kubeconfig login always takes the current-context, so `--context` (and any
kubeconfig detail kopf's minimal parser skips, like exec plugins) would split the operator
across clusters. Instead both sides load the same kubeconfig/context with kubernetes_asyncio,
and kopf gets it as a `ConnectionInfo` from a login handler that reloads it on every (re)login
(kopf logs in again on 401, so refreshed tokens are picked up).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import kopf
from kubernetes_asyncio import config
from kubernetes_asyncio.client import Configuration


async def load_api_config(kubeconfig: str | None, context: str | None) -> Configuration:
    """In a pod (and no kubeconfig or context asked for): the service account; else the
    kubeconfig (`kubeconfig`, else $KUBECONFIG, else ~/.kube/config) with `context`, or
    its current-context."""
    configuration = Configuration()
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    return configuration


def connection_info(configuration: Configuration, trust_env: bool = False) -> kopf.ConnectionInfo:
    """The same server, CA, client certificate and token as `configuration`, for kopf."""
    # kubernetes_asyncio keeps the whole Authorization value: "Bearer <token>" / "Basic <b64>".
    authorization = str(configuration.api_key.get("BearerToken") or "")
    scheme, _, token = authorization.partition(" ")
    if not token:  # a bare token
        scheme, token = "Bearer", authorization
    return kopf.ConnectionInfo(
        server=str(configuration.host),
        ca_path=configuration.ssl_ca_cert or None,
        insecure=not configuration.verify_ssl,
        certificate_path=configuration.cert_file or None,
        private_key_path=configuration.key_file or None,
        scheme=scheme if token else None,
        token=token or None,
        proxy_url=configuration.proxy or None,
        trust_env=trust_env,
    )


def login_handler(
    kubeconfig: str | None, context: str | None
) -> Callable[..., Awaitable[kopf.ConnectionInfo]]:
    """A kopf login handler connecting where `load_api_config(kubeconfig, context)` does."""

    async def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
        loaded = await load_api_config(kubeconfig, context)
        return connection_info(loaded, trust_env=settings.networking.trust_env)

    return login
