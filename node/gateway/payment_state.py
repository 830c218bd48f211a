"""One question's payment as a state machine: reserved → serving → charged | released.

    reserved ──deliver()──▶ serving ──finish() / client_gone() / failed()──▶ charged
        │                                                                       ▲
        ├── finish(); client_gone() once its prefill was sent ──────────────────┘
        └── failed(); client_gone() before its prefill was sent ──▶ released

- `reserved`: the desk checked the payment and holds `price × (prompt + max_tokens)`.
- `serving`: the first token was handed to the response writer. From here the payment is
  consumed for good (the query id is never freed again, a key's hold becomes a charge).
- `charged`: the receipt is signed and on disk (`PaymentDesk.settle`), exactly once.
- `released`: the hold went back, exactly once; the proof can pay another question.

What each exit charges, with `delivered` = tokens handed to the writer (a token counts once the
gateway tries to write it, so a failed write is charged: the nodes did the work) and
`produced` = tokens the answering circuit gave the gateway for this client:

    the answer finished                     prompt + delivered
    the client hung up / timed out          prompt + max(delivered, produced) once the prompt
                                            was sent to the circuit (the nodes started working
                                            for it); before that (queued, routing): released
    a node failed, or anything else broke   prompt + delivered once a token went out;
                                            before that: released (the client got nothing)

Transitions are idempotent (a second charge returns the same receipt, a second release or a
release after a charge does nothing) and logged. `close()` is the exit every handler runs in a
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
        on_charged: Callable[[dict[str, Any], int], None] | None = None,
    ) -> None:
        self.desk = desk
        self.reservation = reservation
        self.prompt_tokens = prompt_tokens
        self.on_charged = on_charged  # (receipt, receipt number): the work ledger
        self.state = State.RESERVED
        self.delivered = 0  # tokens handed to the response writer
        self.produced = 0  # tokens the answering circuit produced for this client
        self.receipt: dict[str, Any] | None = None

    @property
    def consumed(self) -> bool:
        """Whether the payment can no longer be released (a token went out, or charged)."""
        return self.state in (State.SERVING, State.CHARGED)

    @property
    def ended(self) -> bool:
        return self.state in (State.CHARGED, State.RELEASED)

    def produce(self, tokens: int = 1) -> None:
        """The circuit gave the gateway `tokens` more for this client."""
        self._require_open("produce")
        self.produced += tokens

    def restart(self) -> None:
        """A retry on a new circuit starts over (only while nothing went out)."""
        if self.state is not State.RESERVED:
            raise PaymentStateError(f"restart() while {self.state.value}")
        self.produced = 0

    def deliver(self, tokens: int = 1) -> None:
        """`tokens` more are handed to the writer (call it before the write)."""
        self._require_open("deliver")
        if self.state is State.RESERVED:
            self._move(State.SERVING)
        self.delivered += tokens

    def finish(self, circuit: Any) -> dict[str, Any]:
        """The answer is complete: charge the prompt and the delivered tokens."""
        return self._charge(circuit, self.delivered)

    def client_gone(self, circuit: Any, *, prompt_sent: bool) -> None:
        """The client hung up or timed out; `prompt_sent`: the circuit got the prompt."""
        if self.ended:
            return
        if self.state is State.SERVING or prompt_sent or self.produced:
            self._charge(circuit, max(self.delivered, self.produced))
        else:
            self._release("the client left before its prompt reached a circuit")

    def failed(self, circuit: Any) -> None:
        """A node failed (or anything else broke): charge what went out, else release."""
        if self.state is State.SERVING:
            self._charge(circuit, self.delivered)
        elif self.state is State.RESERVED:
            self._release("nothing reached the client")

    close = failed  # the `finally` exit: a no-op once the payment ended

    def _charge(self, circuit: Any, completion_tokens: int) -> dict[str, Any]:
        if self.state is State.CHARGED:
            assert self.receipt is not None
            return self.receipt
        self._require_open("charge")
        keys = tuple(circuit.keys) if circuit is not None else ()
        receipt = self.desk.settle(self.reservation, self.prompt_tokens, completion_tokens, keys)
        self.receipt = receipt
        self._move(State.CHARGED)
        if self.on_charged is not None:
            self.on_charged(receipt, self.desk.receipt_number(self.reservation.query_id))
        return receipt

    def _release(self, why: str) -> None:
        self.desk.release(self.reservation)
        log.info("payment released: %s", why)
        self._move(State.RELEASED)

    def _require_open(self, action: str) -> None:
        if self.ended:
            raise PaymentStateError(f"{action}() after the payment was {self.state.value}")

    def _move(self, state: State) -> None:
        log.info(
            "payment %s → %s query=%s delivered=%d produced=%d",
            self.state.value,
            state.value,
            self.reservation.query_hex[:18],
            self.delivered,
            self.produced,
        )
        self.state = state
