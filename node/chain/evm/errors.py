"""What goes wrong on the EVM chain, as named errors: reverts decoded, RPC refusals classified.

    PlanetError
    ├── ContractRevert            a call reverted; `.error_name`, `.args` (decoded values),
    │   │                         `.named_args`, `.contract`, `.function`
    │   ├── BelowMinimum, NotStaked, QueryExists, QueryNotFunded, ChallengeWindowOpen,
    │   │   AlreadyClaimed, InvalidClaim, AlreadyProven, InsufficientPower, … (by error name)
    │   └── (any other custom error, `Error(string)` or `Panic(uint256)` stays a ContractRevert)
    ├── InsufficientFunds         the sender cannot pay value + gas
    └── UnavailableError          the RPC is unreachable or too slow (`node.chain.evm.rpc`)

Custom errors are decoded from the ABIs' `error` entries (selector = first 4 bytes of
keccak256 of the signature) — the same table for every contract of the deployment, because an
error raised in one contract can bubble up through another (e.g. `Committee.verify`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from eth_abi import decode as abi_decode
from eth_utils import keccak, to_checksum_address
from web3.exceptions import ContractLogicError, Web3RPCError

from protocol.errors import PlanetError

ERROR_STRING_SELECTOR = bytes.fromhex("08c379a0")  # Error(string)
PANIC_SELECTOR = bytes.fromhex("4e487b71")  # Panic(uint256)
PANIC_CODES = {
    0x01: "assert failed",
    0x11: "arithmetic overflow or underflow",
    0x12: "division by zero",
    0x21: "invalid enum value",
    0x31: "pop on empty array",
    0x32: "array index out of bounds",
    0x41: "out of memory",
    0x51: "call to an uninitialised function",
}


class ContractRevert(PlanetError):
    """A contract call reverted with a decoded reason."""

    code = "contract_revert"
    http_status = 409
    exit_status = 8
    error_name: str = ""

    def __init__(
        self,
        error_name: str,
        args: Sequence[Any] = (),
        *,
        named_args: Mapping[str, Any] | None = None,
        contract: str | None = None,
        function: str | None = None,
        data: bytes = b"",
        hint: str | None = None,
    ) -> None:
        where = f"{contract}.{function}" if contract and function else (function or "call")
        shown = ", ".join(f"{k}={_show(v)}" for k, v in (named_args or {}).items()) or ", ".join(
            _show(v) for v in args
        )
        super().__init__(f"{where} reverted: {error_name}({shown})", hint=hint)
        self.error_name = error_name
        self.args = tuple(args)
        self.named_args = dict(named_args or {})
        self.contract = contract
        self.function = function
        self.data = data

    def __str__(self) -> str:
        return self.message


def _show(value: Any) -> str:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


# Typed subclasses for the reverts callers commonly handle; the class name is the custom error
# name in the contracts. Add more by subclassing ContractRevert (registered automatically).
REVERT_TYPES: dict[str, type[ContractRevert]] = {}


def _typed(name: str, hint: str | None = None) -> type[ContractRevert]:
    cls = type(name, (ContractRevert,), {"error_name": name, "default_hint": hint})
    REVERT_TYPES[name] = cls
    return cls


BelowMinimum = _typed("BelowMinimum", "stake at least the role's minimum (minimumStake(role))")
NotStaked = _typed("NotStaked", "stake first (`stake(role)` with at least the minimum)")
UnbondingNotElapsed = _typed("UnbondingNotElapsed", "wait until the unstake delay has passed")
QueryExists = _typed("QueryExists", "a query id can be funded once; use a fresh id")
QueryNotFunded = _typed("QueryNotFunded", "the query has no open deposit (settled/refunded?)")
RefundNotYetAvailable = _typed("RefundNotYetAvailable", "wait for the refund timeout")
ChallengeWindowOpen = _typed("ChallengeWindowOpen", "wait until the challenge window closes")
AlreadyClaimed = _typed("AlreadyClaimed", "each (epoch, account) is paid once")
InvalidClaim = _typed("InvalidClaim", "the Merkle proof does not lead to the epoch's root")
AlreadyProven = _typed("AlreadyProven", "this offence was already slashed")
InvalidSignature = _typed("InvalidSignature", "signatures are 65-byte r||s||v with low s")
InsufficientPower = _typed("InsufficientPower", "collect signatures for at least 2/3 power")
SignersNotSorted = _typed("SignersNotSorted", "sort signatures by ascending signer address")
UnknownSigner = _typed("UnknownSigner", "a signer is not in the current committee")
FraudWindowOpen = _typed(
    "FraudWindowOpen", "recorded work keeps the stake until its challenge window closes"
)
ChallengeNotCommitted = _typed(
    "ChallengeNotCommitted", "commit the challenge (commitChallenge) in an earlier block first"
)
ChallengeNotMatured = _typed(
    "ChallengeNotMatured", "send the proof in a later block than its commitment"
)
WrongConsumer = _typed("WrongConsumer", "the committee signed this for another deployment")
WorkAlreadyCovered = _typed(
    "WorkAlreadyCovered", "a later piece of the node's work is already recorded"
)
NothingToWithdraw = _typed("NothingToWithdraw", "the prepaid balance at this gateway is empty")
WithdrawalAlreadyRequested = _typed(
    "WithdrawalAlreadyRequested", "a withdrawal is already pending; wait for it, or cancel it"
)
WithdrawalNotRequested = _typed(
    "WithdrawalNotRequested", "request the withdrawal first (`planet balance withdraw` requests it)"
)
WithdrawalNotYetAvailable = _typed(
    "WithdrawalNotYetAvailable", "wait until the withdrawal delay has passed"
)
InvalidGateway = _typed(
    "InvalidGateway", "name the gateway by its signing address (`gateway` in its /v1/pools)"
)


class InsufficientFunds(PlanetError):
    """The sending account cannot pay value + gas."""

    code = "insufficient_funds"
    exit_status = 8


# --- decoding revert data -----------------------------------------------------------------------


class RevertDecoder:
    """Selector → (name, input types, input names) table built from ABIs' error entries."""

    def __init__(self, abis: Iterable[Sequence[Mapping[str, Any]]]) -> None:
        self._errors: dict[bytes, tuple[str, list[str], list[str]]] = {}
        for abi in abis:
            for entry in abi:
                if entry.get("type") != "error":
                    continue
                types = [_abi_type(item) for item in entry.get("inputs", [])]
                names = [item.get("name") or f"arg{i}" for i, item in enumerate(entry["inputs"])]
                signature = f"{entry['name']}({','.join(types)})"
                self._errors[keccak(text=signature)[:4]] = (entry["name"], types, names)

    def __contains__(self, name: str) -> bool:
        return any(entry[0] == name for entry in self._errors.values())

    def decode(self, data: bytes) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        """(error name, positional values, named values) for revert data."""
        selector, body = data[:4], data[4:]
        if not data:
            return "EmptyRevert", (), {}
        if selector == ERROR_STRING_SELECTOR:
            (reason,) = _safe_decode(["string"], body) or ("<undecodable>",)
            return "Error", (reason,), {"reason": reason}
        if selector == PANIC_SELECTOR:
            (code,) = _safe_decode(["uint256"], body) or (-1,)
            return "Panic", (code,), {"code": code, "meaning": PANIC_CODES.get(code, "unknown")}
        if selector in self._errors:
            name, types, names = self._errors[selector]
            values = _safe_decode(types, body)
            if values is not None:
                values = tuple(_normalise(v, t) for v, t in zip(values, types, strict=True))
                return name, values, dict(zip(names, values, strict=True))
        return "UnknownError", (data,), {"data": data}

    def exception(
        self, data: bytes, *, contract: str | None = None, function: str | None = None
    ) -> ContractRevert:
        name, values, named = self.decode(data)
        cls = REVERT_TYPES.get(name, ContractRevert)
        return cls(
            name,
            values,
            named_args=named,
            contract=contract,
            function=function,
            data=data,
            hint=getattr(cls, "default_hint", None),
        )


def _abi_type(item: Mapping[str, Any]) -> str:
    kind = item["type"]
    if kind.startswith("tuple"):
        inner = ",".join(_abi_type(c) for c in item.get("components", []))
        return f"({inner}){kind[len('tuple') :]}"
    return kind


def _safe_decode(types: list[str], body: bytes) -> tuple[Any, ...] | None:
    try:
        return tuple(abi_decode(types, body))
    except Exception:  # malformed revert data is reported as undecodable, never raised
        return None


def _normalise(value: Any, solidity_type: str) -> Any:
    if solidity_type == "address" and isinstance(value, str):
        return to_checksum_address(value)
    return value


def revert_data(error: ContractLogicError) -> bytes:
    """The raw revert bytes carried by a web3 ContractLogicError (custom or Error/Panic)."""
    data = error.data
    if isinstance(data, dict):
        data = data.get("data") or next(iter(data.values()), None)
    if isinstance(data, str) and data.startswith("0x"):
        try:
            return bytes.fromhex(data[2:])
        except ValueError:
            return b""
    return b""


# --- RPC refusals -------------------------------------------------------------------------------


def rpc_error(error: Web3RPCError, rpc_url: str, what: str) -> PlanetError:
    """A transaction the RPC refused, as a named error (funds, nonce, or anything else)."""
    message = str(error.message if hasattr(error, "message") else error)
    lowered = message.lower()
    if "insufficient funds" in lowered or ("funds" in lowered and "gas" in lowered):
        return InsufficientFunds(
            f"{what}: insufficient funds for value + gas on {rpc_url}",
            hint="fund the account, or use a dev key on a local anvil",
        )
    if "nonce" in lowered:
        return PlanetError(f"{what}: nonce problem ({message})", code="nonce")
    return PlanetError(f"{what}: the RPC rejected the transaction ({message})", code="rpc_error")
