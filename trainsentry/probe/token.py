"""The probe token of one TrainingJob, derived from the installation's master token (pure).

The gateway holds one master probe token. Every TrainingJob's namespace gets, from the
operator, a Secret holding only that job's token:

    job_token(master, namespace, name) = hex(HMAC-SHA256(master, DOMAIN + "namespace/name"))

so a team holds a token that speaks for its own job and no other: the gateway checks a hang
trigger for job J against `job_token(master, J)` by recomputing it (nothing is stored), and
fetches J's dumps with that same token. Knowing one job's token tells nothing of another's
or of the master (HMAC is a PRF). Namespace and name are Kubernetes names, which hold no
"/", so "namespace/name" names exactly one job.

A probe given the master token itself (the manual path, before per-job Secrets) also accepts
its job's derived token, so the gateway never needs to send the master to a pod.
"""

from __future__ import annotations

import hashlib
import hmac

DOMAIN = b"trainsentry-probe-token/v1\n"


def job_token(master: str, namespace: str, name: str) -> str:
    """Pure: the token of TrainingJob `namespace/name` under `master` (64 hex characters)."""
    message = DOMAIN + f"{namespace}/{name}".encode()
    return hmac.new(master.encode(), message, hashlib.sha256).hexdigest()


def accepted_tokens(token: str | None, namespace: str, name: str) -> tuple[str, ...]:
    """Pure: the bearer tokens a probe configured with `token` for job `namespace/name`
    accepts: its own, and (when it knows its job) the token derived from it for that job."""
    if not token:
        return ()
    if not namespace or not name:
        return (token,)
    return (token, job_token(token, namespace, name))
