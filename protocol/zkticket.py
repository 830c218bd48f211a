"""ZK tickets: how a node's claim about one small fixed-point operation is hashed, and how a proof
that the claim is wrong is laid out for `EzklFaultVerifier.verifyFault(proof, reveal)`.

A ZK-checked operation (an ezkl circuit, see node/verifier/zk/) takes a vector of fixed-point
integers and returns one. A node that computes it signs an ordinary `Reveal` whose

    inputHash  = tensor_hash(input integers)    outputHash = tensor_hash(output integers)
    tensor_hash(v) = keccak256(word(v[0]) ‖ word(v[1]) ‖ …)     word(x) = 32-byte big-endian of
                                                                 x mod r (BN254 scalar field)

which is exactly how the circuit's public instances look on chain, so the Solidity adapter
hashes slices of the instances it is given and compares them with what the node signed.

A fault proof (bytes) is `word(in[0]) … word(in[n-1]) ‖ word(out[0]) … word(out[m-1]) ‖ halo2
proof`: the instances first (n, m fixed per circuit), the ezkl proof after them. It proves "on
the input the node signed, the circuit gives `out`", and is a fault only when `out` does not hash
to the node's `outputHash`. Every word must be a canonical field element (< r): the verifier
reduces instances mod r, so a non-canonical output word would hash differently from the same
field element and could fake a difference.

Import-light on purpose (eth-hash only, through protocol.abi_words): the node, the verifier and
the tests hash claims without ezkl.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from protocol.abi_words import keccak
from protocol.errors import ProtocolError

# BN254 (alt_bn128) scalar field: the field ezkl's KZG circuits and the EVM verifier work in.
FIELD_MODULUS = 21888242871839275222246405745257275088548364400416034343698204186575808495617
WORD_BYTES = 32
# Fixed-point integers stay far below r / 2, so their sign is recoverable from the field element.
MAX_ABS_VALUE = 2**128
MAX_TENSOR_LENGTH = 4096
MAX_PROOF_BYTES = 64 * 1024


class ZkTicketError(ProtocolError):
    """A ZK ticket value or fault-proof blob is malformed."""

    code = "zk_ticket"


def to_field(value: int) -> int:
    """The field element of a signed fixed-point integer (negatives wrap to r − |v|)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ZkTicketError(f"fixed-point values are ints, got {type(value).__name__}")
    if abs(value) >= MAX_ABS_VALUE:
        raise ZkTicketError(f"fixed-point value {value} is outside ±2^128")
    return value % FIELD_MODULUS


def from_field(element: int) -> int:
    """The signed integer a canonical field element stands for (inverse of `to_field`)."""
    if not 0 <= element < FIELD_MODULUS:
        raise ZkTicketError(f"{element} is not a canonical field element")
    value = element - FIELD_MODULUS if element > FIELD_MODULUS // 2 else element
    if abs(value) >= MAX_ABS_VALUE:
        raise ZkTicketError(f"field element {element} is not a fixed-point value")
    return value


def words(values: Sequence[int]) -> bytes:
    """`word(v[0]) ‖ word(v[1]) ‖ …` (32 bytes each, big-endian field elements)."""
    if not 0 < len(values) <= MAX_TENSOR_LENGTH:
        raise ZkTicketError(f"a tensor has 1..{MAX_TENSOR_LENGTH} values, got {len(values)}")
    return b"".join(to_field(v).to_bytes(WORD_BYTES, "big") for v in values)


def tensor_hash(values: Sequence[int]) -> bytes:
    """What a node signs as `inputHash` / `outputHash` for a ZK-checked operation."""
    return keccak(words(values))


@dataclass(frozen=True, slots=True)
class FaultProof:
    """A parsed fault-proof blob: the circuit's public input and output (signed integers) and
    the halo2 proof bytes."""

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    proof: bytes

    def encode(self) -> bytes:
        """The bytes `verifyFault` takes."""
        if not 0 < len(self.proof) <= MAX_PROOF_BYTES:
            raise ZkTicketError(f"a proof has 1..{MAX_PROOF_BYTES} bytes, got {len(self.proof)}")
        return words(self.inputs) + words(self.outputs) + self.proof

    @property
    def input_hash(self) -> bytes:
        return tensor_hash(self.inputs)

    @property
    def output_hash(self) -> bytes:
        return tensor_hash(self.outputs)

    def instances(self) -> list[int]:
        """The public instances as field elements (inputs, then outputs)."""
        return [to_field(v) for v in (*self.inputs, *self.outputs)]

    @classmethod
    def decode(cls, blob: bytes, n_inputs: int, n_outputs: int) -> FaultProof:
        """Parse `blob` for a circuit with `n_inputs` and `n_outputs` public values;
        `ZkTicketError` for anything that `EzklFaultVerifier` would refuse on its shape."""
        if not isinstance(blob, bytes | bytearray):
            raise ZkTicketError("a fault proof is bytes")
        head = (n_inputs + n_outputs) * WORD_BYTES
        if len(blob) <= head or len(blob) > head + MAX_PROOF_BYTES:
            raise ZkTicketError(
                f"a fault proof for {n_inputs}+{n_outputs} instances has {head + 1}.."
                f"{head + MAX_PROOF_BYTES} bytes, got {len(blob)}"
            )
        elements = [
            int.from_bytes(blob[i : i + WORD_BYTES], "big") for i in range(0, head, WORD_BYTES)
        ]
        values = tuple(from_field(e) for e in elements)
        return cls(values[:n_inputs], values[n_inputs:], bytes(blob[head:]))
