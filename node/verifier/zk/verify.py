"""Python verification of a fault proof against a node-signed reveal: the same checks, in the
same order, as `contracts/zk/EzklFaultVerifier.sol`'s `verifyFault`, with ezkl's own verifier in
place of the generated Solidity one.

    check = verify_fault(circuit, blob, reveal)
    check.fault          # True only for a valid proof that the reveal's output is wrong
    check.reason         # why not, otherwise ("wrong model", "input differs", ...)
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from node.verifier.zk.build import BuiltCircuit
from node.verifier.zk.engine import run_step
from protocol.eip712 import Reveal
from protocol.zkticket import FaultProof, ZkTicketError


@dataclass(frozen=True)
class FaultCheck:
    fault: bool
    reason: str
    verify_s: float | None = None


def verify_fault(circuit: BuiltCircuit, blob: bytes, reveal: Reveal) -> FaultCheck:
    """Whether `blob` proves that the node-signed `reveal` is wrong (see module docstring)."""
    if reveal.manifest_hash != circuit.manifest_hash or reveal.shard != circuit.shard:
        return FaultCheck(False, "the reveal is about another model or shard")
    try:
        proof = FaultProof.decode(blob, circuit.n_inputs, circuit.n_outputs)
    except ZkTicketError as error:
        return FaultCheck(False, f"malformed proof: {error.message}")
    if proof.input_hash != reveal.input_hash:
        return FaultCheck(False, "the proof is about another input")
    if proof.output_hash == reveal.output_hash:
        return FaultCheck(False, "the node's output is what the circuit gives")
    with tempfile.TemporaryDirectory(prefix="planet-zk-") as scratch:
        result = run_step(
            "verify",
            {
                "dir": str(circuit.dir),
                "proof_hex": proof.proof.hex(),
                "instances": [str(v) for v in proof.instances()],
                "proof": str(Path(scratch) / "proof.json"),
                "srs": str(circuit.srs),
            },
        )
    if not result["ok"]:
        return FaultCheck(False, "the proof does not verify", result["verify_s"])
    return FaultCheck(True, "proven fault", result["verify_s"])
