"""Why a node refused a frame or the session it names: one tree, each class with a stable `code`.

A node sends the refusal by name to the client's link (`{"op": "error", "code", "message"}`,
protocol/stream.py) and keeps serving; a client raises what it reads as `RemoteError(code)`.

    ProtocolError (protocol.errors)
    └── FrameError                bad_frame
        ├── BadHeaderError        bad_header       unknown kind, version or flags; short header
        ├── BadSessionIdError     bad_session_id   not 22-64 characters of [A-Za-z0-9_-]
        ├── BadDtypeError         bad_dtype
        ├── BadCodecError         bad_codec
        ├── BadPositionsError     bad_positions    a gap, or positions past 2^31 - 1
        ├── BadBodyError          bad_body         body size or contents do not fit the header
        ├── NonFiniteError        non_finite       NaN/Inf in, or an output too large to encode
        │   └── Fp16OverflowError non_finite       a value beyond float16's ±65504 (fp16 wire)
        ├── TooLargeError         too_large        more positions or bytes than the node takes
        ├── SessionExpiredError   session_expired  the session was evicted or closed
        └── WrongShardError       wrong_shard      the open names a shard this node does not serve

protocol/stream.py adds the control protocol's refusals (bad_control, bad_route,
next_hop_not_allowed, unknown_stream, bad_feed, downstream_unavailable) to the same tree.
"""

from __future__ import annotations

from protocol.errors import ProtocolError


class FrameError(ProtocolError):
    """A frame (or the session it names) was rejected. `code` names the reason."""

    code = "bad_frame"
    http_status = 400


class BadHeaderError(FrameError):
    code = "bad_header"


class BadSessionIdError(FrameError):
    code = "bad_session_id"


class BadDtypeError(FrameError):
    code = "bad_dtype"


class BadCodecError(FrameError):
    code = "bad_codec"


class BadPositionsError(FrameError):
    code = "bad_positions"


class BadBodyError(FrameError):
    code = "bad_body"


class NonFiniteError(FrameError):
    code = "non_finite"


class Fp16OverflowError(NonFiniteError):
    """Activations beyond float16's range (|x| > 65504) asked for in a float16 frame: refused,
    never saturated or sent as inf. Same wire code as NonFiniteError (clients know it)."""


class TooLargeError(FrameError):
    code = "too_large"
    http_status = 413


class SessionExpiredError(FrameError):
    code = "session_expired"
    http_status = 410

    def __init__(self, session: str) -> None:
        super().__init__(
            f"session {session} was evicted (idle too long or closed); its KV cache is gone",
            hint="start a new session from position 0",
        )


class WrongShardError(FrameError):
    code = "wrong_shard"
    http_status = 409

    def __init__(self, got: int, served: int) -> None:
        super().__init__(f"frame is for shard {got} but this node serves shard {served}")
