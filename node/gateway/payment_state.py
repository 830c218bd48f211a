"""One question's payment as a state machine: reserved → serving → charged | released.

    reserved ──deliver()──▶ serving ──charge() / close()──▶ charged
        │                                                    ▲
        ├──────────────────────charge()──────────────────────┘   (an answer handed whole)
        └──release() / close()──▶ released

- `reserved`: the desk checked the payment and holds `price × (prompt + max_tokens)`.
- `serving`: the first token was handed to the response writer. From here the payment is
  consumed for good (the query id is never freed again, the key's hold becomes a charge): every
  exit — answer finished, client hung up (a write failed), client timed out, a node failed —
  charges `price × (prompt tokens + tokens handed to the writer)`. A token counts once the
  gateway tries to write it, so a failed write is still charged: the nodes did the work.
- `released`: only from `reserved` — nothing reached the client and the question failed
  (no circuit, a node failed before the first token). The hold goes back, exactly once.
- `charged`: the receipt is signed and on disk (`PaymentDesk.settle`).

Every transition is idempotent (charging twice returns the same receipt, releasing twice or
after a charge does nothing) and logged. `close()` is the one exit every handler runs in a
`finally`: whatever happened, the question ends in exactly one terminal state.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Any

from node.gateway.payments import PaymentDesk, Reservation

log = logging.getLogger(__name__)


class State(enum.Enum):
    RESERVED = "reserved"
    SERVING = "serving"
    CHARGED = "charged"
    RELEASED = "released"


class PaymentStateError(RuntimeError):
    """A transition the machine does not have (a bug in the caller, never a client's doing)."""


class QuestionPayment:
    def __init__(
        self,
        desk: PaymentDesk,
        reservation: Reservation,
        prompt_tokens: int,
        *,
        on_charged: Callable[[dict[str, Any], Any], None] | None = None,
    ) -> None:
        self.desk = desk
        self.reservation = reservation
        self.prompt_tokens = prompt_tokens
        self.on_charged = on_charged  # (receipt, circuit): the work ledger
        self.state = State.RESERVED
        self.delivered = 0  # tokens handed to the response writer
        self.receipt: dict[str, Any] | None = None

    @property
    def consumed(self) -> bool:
        """Whether the payment can no longer be released (a token went out, or charged)."""
        return self.state in (State.SERVING, State.CHARGED)

    def deliver(self, tokens: int = 1) -> None:
        """`tokens` more are handed to the writer (call it before the write)."""
        if self.state in (State.CHARGED, State.RELEASED):
            raise PaymentStateError(f"deliver() after the payment was {self.state.value}")
        if self.state is State.RESERVED:
            self._move(State.SERVING)
        self.delivered += tokens

    def charge(self, circuit: Any) -> dict[str, Any]:
        """Charge the prompt and the delivered tokens; the signed receipt (the same one when
        already charged). `circuit` has `.keys` (the receipt's nodes)."""
        if self.state is State.CHARGED:
            assert self.receipt is not None
            return self.receipt
        if self.state is State.RELEASED:
            raise PaymentStateError("charge() after the payment was released")
        keys = tuple(circuit.keys) if circuit is not None else ()
        receipt = self.desk.settle(self.reservation, self.prompt_tokens, self.delivered, keys)
        self.receipt = receipt
        self._move(State.CHARGED)
        if self.on_charged is not None and circuit is not None:
            self.on_charged(receipt, circuit)
        return receipt

    def release(self) -> bool:
        """Return the hold (only while nothing was delivered); False when it was not released
        now (already released, or a token went out: then only a charge ends it)."""
        if self.state is not State.RESERVED:
            if self.state is State.SERVING:
                log.warning(
                    "payment not released: %d tokens went out query=%s",
                    self.delivered,
                    self.reservation.query_hex[:18],
                )
            return False
        self.desk.release(self.reservation)
        self._move(State.RELEASED)
        return True

    def close(self, circuit: Any) -> None:
        """The one exit: charge what went out, or release what did not; a no-op once ended."""
        if self.state is State.SERVING:
            self.charge(circuit)
        elif self.state is State.RESERVED:
            self.release()

    def _move(self, state: State) -> None:
        log.info(
            "payment %s → %s query=%s delivered=%d",
            self.state.value,
            state.value,
            self.reservation.query_hex[:18],
            self.delivered,
        )
        self.state = state
