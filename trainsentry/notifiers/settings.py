"""The channels' secrets: each is named in the settings (`*_env` fields of the `channels:`
section, config/channels.py) by the environment variable that holds it, and read here, once,
at start-up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


class SecretMissing(LookupError):
    """A secret's environment variable is not set."""


def read_secret(env_name: str, env: Mapping[str, str] | None = None) -> str:
    """The value of the secret held in environment variable `env_name`."""
    env = os.environ if env is None else env
    value = env.get(env_name, "")
    if not value:
        raise SecretMissing(f"environment variable {env_name} (a secret) is not set")
    return value
