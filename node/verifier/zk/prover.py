"""The node-side half of a ZK ticket: what a node signs for the ZK-checked operation, and the
proof that settles a node-signed claim about it.

    prover = TicketProver(circuit)
    claim = prover.claim(x)                    # the circuit's fixed-point input and output of x
    reveal = Reveal(session, step, circuit.shard, circuit.manifest_hash,
                    claim.input_hash, claim.output_hash, salt, signed_at)   # what a node signs
    proof = prover.prove(x, reveal)            # FaultProof bound to that reveal's input
    proof.encode()                             # bytes for FraudProofs.proveComputationFault

Binding: `prove` refuses a reveal for another model or shard and an `x` whose fixed-point form
does not hash to the reveal's `inputHash`, and the adapter contract re-checks both, so a proof
about another input cannot be used against this slot. The node's signature on the reveal binds
the slot (session, step, shard) to that input and output; the proof settles whether the output
is what the circuit gives (a fault when it is not).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from node.verifier.zk.build import BuiltCircuit
from node.verifier.zk.engine import run_step
from protocol.eip712 import Reveal
from protocol.errors import UsageError
from protocol.zkticket import FaultProof, from_field, tensor_hash


@dataclass(frozen=True)
class Claim:
    """The circuit's fixed-point input and output for one input vector (signed integers,
    value = integer / 2^scale)."""

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    @property
    def input_hash(self) -> bytes:
        return tensor_hash(self.inputs)

    @property
    def output_hash(self) -> bytes:
        return tensor_hash(self.outputs)


class TicketProver:
    """Witnesses and proofs for one built circuit (each call runs ezkl in its own venv)."""

    def __init__(self, circuit: BuiltCircuit) -> None:
        self.circuit = circuit
        self.last_prove_s: float | None = None  # wall seconds of the last proof
        self.last_prove_cpu_s: float | None = None  # CPU seconds (all threads) of the last proof

    def _input_file(self, scratch: Path, x: torch.Tensor) -> Path:
        if x.shape != (1, self.circuit.n_inputs) or x.dtype != torch.float32:
            raise UsageError(
                f"the operation's input is float32 [1, {self.circuit.n_inputs}], got "
                f"{x.dtype} {list(x.shape)}"
            )
        if not bool(torch.isfinite(x).all()):
            raise UsageError("the operation's input has NaN or infinite values")
        path = scratch / "input.json"
        path.write_text(json.dumps({"input_data": [x.reshape(-1).tolist()]}))
        return path

    def _witness(self, scratch: Path, x: torch.Tensor) -> Claim:
        result = run_step(
            "witness",
            {
                "dir": str(self.circuit.dir),
                "input": str(self._input_file(scratch, x)),
                "witness": str(scratch / "witness.json"),
            },
        )
        return Claim(
            tuple(from_field(int(v)) for v in result["inputs"]),
            tuple(from_field(int(v)) for v in result["outputs"]),
        )

    def claim(self, x: torch.Tensor) -> Claim:
        """What an honest node signs for input `x` [1, H]."""
        with tempfile.TemporaryDirectory(prefix="planet-zk-") as scratch:
            return self._witness(Path(scratch), x)

    def prove(self, x: torch.Tensor, reveal: Reveal) -> FaultProof:
        """A proof of the circuit's output on `x`, for judging the node-signed `reveal` (a fault
        exactly when that output does not hash to `reveal.output_hash`)."""
        if reveal.manifest_hash != self.circuit.manifest_hash or reveal.shard != self.circuit.shard:
            raise UsageError(
                f"the reveal is about shard {reveal.shard} of model 0x{reveal.manifest_hash.hex()}"
                f"; this circuit checks shard {self.circuit.shard} of "
                f"0x{self.circuit.manifest_hash.hex()}"
            )
        with tempfile.TemporaryDirectory(prefix="planet-zk-") as scratch_dir:
            scratch = Path(scratch_dir)
            claim = self._witness(scratch, x)
            if claim.input_hash != reveal.input_hash:
                raise UsageError(
                    "this input does not hash to the reveal's inputHash",
                    hint="prove with the input the node signed (its ticket's activations)",
                )
            result = run_step(
                "prove",
                {
                    "dir": str(self.circuit.dir),
                    "witness": str(scratch / "witness.json"),
                    "proof": str(scratch / "proof.json"),
                    "srs": str(self.circuit.srs),
                },
            )
        self.last_prove_s = float(result["prove_s"])
        self.last_prove_cpu_s = float(result["prove_cpu_s"])
        values = [from_field(int(v)) for v in result["instances"]]
        n = self.circuit.n_inputs
        return FaultProof(tuple(values[:n]), tuple(values[n:]), bytes.fromhex(result["proof_hex"]))
