"""What the rest of trainsentry (demo/) may use of the running gateway: the app as
`trainsentry gateway` builds it, the `Gateway` its handlers share (to settle it on virtual
time; `Off`, the type of its parts that are off), the webhook path, the on-call section's
reader, and Alertmanager's fingerprint of a label set as the intake computes it. The
policy's own face is `gateway/policy/__init__.py`. Everything else in gateway/ is the
gateway's own (tests/architecture/test_gateway_face.py).
"""

from trainsentry.gateway.absent import Off
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY, Gateway
from trainsentry.gateway.sections import oncall_of
from trainsentry.gateway.stages.intake import label_fingerprint

__all__ = [
    "GATEWAY_KEY",
    "WEBHOOK_PATH",
    "Gateway",
    "Off",
    "create_app",
    "label_fingerprint",
    "oncall_of",
]
