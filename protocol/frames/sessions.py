"""Session capabilities and their public tags.

A hop's session is opened with a capability: a random secret the client drew for that node
alone (node/client/capabilities.py). The node keys the session by `session_tag(capability)`
and logs only the tag; the tag can be shown to a third party (a verifier, a commitment) without
giving it the power to act on the session, and no tag reveals its capability or any other hop's.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from protocol.frames.errors import BadSessionIdError

SESSION_MIN_CHARS: Final = 22  # 22 base64url characters carry >= 128 bits
SESSION_MAX_CHARS: Final = 64
_SESSION_RE = re.compile(rf"[A-Za-z0-9_-]{{{SESSION_MIN_CHARS},{SESSION_MAX_CHARS}}}")
_SESSION_TAG_DOMAIN: Final = b"planet/session-tag/v1\x00"


def check_session_id(value: object) -> str:
    """`value` if it is a session capability (22-64 characters of [A-Za-z0-9_-]), else
    BadSessionIdError."""
    if not isinstance(value, str) or not _SESSION_RE.fullmatch(value):
        raise BadSessionIdError(
            f"session must be {SESSION_MIN_CHARS}-{SESSION_MAX_CHARS} characters of [A-Za-z0-9_-]"
        )
    return value


def session_tag(capability: str) -> str:
    """The public name of a hop's session: sha256 over a domain prefix and the capability, hex."""
    return hashlib.sha256(_SESSION_TAG_DOMAIN + check_session_id(capability).encode()).hexdigest()
