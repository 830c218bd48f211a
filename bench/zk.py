"""ZK ticket benchmark: ezkl prove / verify time, proof size and on-chain verify gas for the
ZK-checked operation (SmolLM2-135M shard 1: RMSNorm of its first layer + one 64-wide query head,
576 → 64, fixed point 2^-7) — one JSON object on stdout, logs on stderr.

    python bench/zk.py               # 3 proofs
    python bench/zk.py --repeats 1
    python bench/zk.py --quick       # smoke run: 1 proof of a 4-wide slice of the head

`--width` keeps the head's first W query rows (default 64, the product's circuit; --quick: 4,
whose circuit builds and proves in seconds and still goes through every step below).

The circuit comes from the build cache ($PLANET_HOME/zk; built first if missing, and `build_s` then
says how long that took). Each repeat proves a different real input (the hidden state shard 1
receives for one of three sentences). `zk_prove_s` is wall time and depends on the box's load;
`zk_prove_cpu_s` is the prover's CPU time over all its threads (load-independent). Python
verify = ezkl's verifier in its own venv (`zk_verify_python_s`: inside the worker;
`zk_verify_python_wall_s`: including the process start).
Gas on a fresh anvil, each a transaction's gasUsed (21 000 + ~390 000 of calldata for the
24 KB blob included): `zk_halo2_verify_tx_gas` = the generated verifier's `verifyProof` alone,
`zk_fault_verify_tx_gas` = `EzklFaultVerifier.verifyFault` (hash checks + verifier),
`prove_computation_fault_gas` = the whole slashing transaction through FraudProofs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eth_utils import keccak

from bench._common import machine, median, parse_with_quick, spread

log = logging.getLogger("bench.zk")
TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Planet serves language models on computers that do not trust each other.",
    "A verifier recomputes one step and compares it with what the node signed.",
)
ETHER = 10**18


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _deploy_gas(w3, address: str) -> int:
    """gasUsed of the transaction that created `address` (anvil mines one tx per block)."""
    for number in range(w3.eth.block_number, -1, -1):
        for tx in w3.eth.get_block(number, full_transactions=True)["transactions"]:
            receipt = w3.eth.get_transaction_receipt(tx["hash"])
            if receipt["contractAddress"] and receipt["contractAddress"].lower() == address.lower():
                return int(receipt["gasUsed"])
    raise RuntimeError(f"no creation transaction for {address}")


def _tx_gas(chain, call) -> int:
    """gasUsed of `call` sent as a transaction from `chain`'s account (10 M gas limit)."""
    w3 = chain.w3
    tx = call.build_transaction(
        {
            "from": chain.address,
            "nonce": w3.eth.get_transaction_count(chain.address, "pending"),
            "gas": 10_000_000,
        }
    )
    signed = chain.account.sign_transaction(tx)
    receipt = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(signed.raw_transaction)
    )
    if receipt["status"] != 1:
        raise RuntimeError("verification transaction reverted")
    return int(receipt["gasUsed"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="proofs to time (default 3)")
    parser.add_argument(
        "--width", type=int, default=64, help="query rows of the head in the circuit (64)"
    )
    args = parse_with_quick(parser, {"repeats": 1, "width": 4})
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    load_start = os.getloadavg()[0]

    from deploy.anvil import ANVIL_DEV_KEY, rpc_call, start_anvil
    from deploy.evm import DeployConfig, compile_contracts, deploy_all
    from deploy.zk import deploy_fault_verifier
    from node.chain.evm.account import PlanetChain
    from node.model.prepare import prepare
    from node.verifier.zk.build import build_circuit
    from node.verifier.zk.circuit import load_op
    from node.verifier.zk.inputs import shard_input
    from node.verifier.zk.prover import TicketProver
    from node.verifier.zk.verify import verify_fault
    from protocol.eip712 import ROLE_COMPUTE, Reveal, address_of
    from protocol.zkticket import tensor_hash

    if args.quick:  # the cached shards, not hashed first (load_op checks shard 1's file)
        from harness.shard_cache import prepared_manifest

        manifest = prepared_manifest(parts=3, quant="none")
    else:
        manifest = prepare(parts=3, quant="none", progress=lambda m: log.info("%s", m))
    op, spec = load_op(manifest, shard=1, head=0, width=args.width)
    inputs = [shard_input(manifest, 1, text) for text in TEXTS[: args.repeats]]
    started = time.monotonic()
    circuit = build_circuit(op, spec, inputs[0])
    built_now = time.monotonic() - started > 5
    prover = TicketProver(circuit)

    witness_s, prove_s, prove_cpu_s, verify_s, verify_wall_s = [], [], [], [], []
    proofs = []
    for i in range(args.repeats):
        x = inputs[i % len(inputs)]
        t0 = time.monotonic()
        claim = prover.claim(x)
        witness_s.append(time.monotonic() - t0)
        wrong = (claim.outputs[0] + 1, *claim.outputs[1:])
        reveal = Reveal(
            keccak(text=f"bench {i}"), i, circuit.shard, circuit.manifest_hash,
            claim.input_hash, tensor_hash(wrong), keccak(text="salt"), 1_767_225_600,
        )  # fmt: skip
        proof = prover.prove(x, reveal)
        prove_s.append(prover.last_prove_s or 0.0)
        prove_cpu_s.append(prover.last_prove_cpu_s or 0.0)
        t0 = time.monotonic()
        check = verify_fault(circuit, proof.encode(), reveal)
        verify_wall_s.append(time.monotonic() - t0)
        if not check.fault:
            raise RuntimeError(f"a valid fault proof was refused: {check.reason}")
        verify_s.append(check.verify_s or 0.0)
        proofs.append((reveal, proof))
        log.info("repeat %d: prove %.1f s", i, prove_s[-1])

    compile_contracts()
    with start_anvil(_free_port()) as anvil:
        zk = deploy_fault_verifier(anvil.rpc_url, ANVIL_DEV_KEY, circuit)
        committee = [(address_of(keccak(text=f"bench zk committee {i}")), 1) for i in range(4)]
        deployment = deploy_all(
            anvil.rpc_url,
            ANVIL_DEV_KEY,
            DeployConfig.devnet(committee=committee, fault_verifier=zk.adapter),
        )
        node_key, challenger_key = keccak(text="bench zk node"), keccak(text="bench zk challenger")
        for key in (node_key, challenger_key):
            rpc_call(anvil.rpc_url, "anvil_setBalance", [address_of(key), hex(100 * ETHER)])
        node = PlanetChain(deployment, node_key)
        challenger = PlanetChain(deployment, challenger_key)
        w3 = challenger.w3
        halo2 = w3.eth.contract(address=zk.halo2, abi=circuit.verifier["abi"])
        reveal, proof = proofs[0]
        adapter_abi = [
            item
            for item in json.loads(
                next(Path("artifacts/contracts/zk").rglob("EzklFaultVerifier.json")).read_text()
            )["abi"]
            if item.get("name") == "verifyFault"
        ]
        adapter = w3.eth.contract(address=zk.adapter, abi=adapter_abi)
        reveal_tuple = (
            reveal.session, reveal.step, reveal.shard, reveal.manifest_hash,
            reveal.input_hash, reveal.output_hash, reveal.salt, reveal.signed_at,
        )  # fmt: skip
        blob = proof.encode()
        # Both as transactions with a generous limit (gasUsed incl. 21 000 + calldata): an
        # eth_estimateGas of verifyFault would be wrong, because its try/catch turns an
        # out-of-gas verifier into `false` instead of a revert.
        halo2_call = halo2.functions.verifyProof(proof.proof, proof.instances())
        fault_call = adapter.functions.verifyFault(blob, reveal_tuple)
        if not (halo2_call.call() and fault_call.call()):
            raise RuntimeError("the deployed verifier refused a valid proof")
        halo2_gas = _tx_gas(challenger, halo2_call)
        fault_gas = _tx_gas(challenger, fault_call)
        node.staking.stake(ROLE_COMPUTE, 2 * ETHER)
        result = challenger.fraud_proofs.prove_computation_fault(
            reveal, reveal.sign(node.account.key, node.fraud_proofs.domain()), proof.encode()
        )
        if result.event("Slashed")["offence"] != 3:
            raise RuntimeError("the fault proof did not slash FailedVerification")
        slash_gas = result.gas_used
        halo2_deploy = _deploy_gas(w3, zk.halo2)
        adapter_deploy = _deploy_gas(w3, zk.adapter)
        runtime_bytes = len(w3.eth.get_code(zk.halo2))

    metrics = {
        "zk_prove_s": round(median(prove_s), 2),
        "zk_prove_s_spread": spread(prove_s),
        "zk_prove_cpu_s": round(median(prove_cpu_s), 2),
        "zk_witness_s": round(median(witness_s), 3),
        "zk_verify_python_s": round(median(verify_s), 3),
        "zk_verify_python_wall_s": round(median(verify_wall_s), 3),
        "zk_proof_bytes": len(proofs[0][1].proof),
        "zk_fault_proof_bytes": len(proofs[0][1].encode()),
        "zk_halo2_verify_tx_gas": halo2_gas,
        "zk_fault_verify_tx_gas": fault_gas,
        "prove_computation_fault_gas": slash_gas,
        "zk_halo2_verifier_deploy_gas": halo2_deploy,
        "zk_adapter_deploy_gas": adapter_deploy,
        "zk_halo2_verifier_runtime_bytes": runtime_bytes,
        "zk_pk_bytes": (circuit.dir / "pk.key").stat().st_size,
        "zk_vk_bytes": (circuit.dir / "vk.key").stat().st_size,
        "zk_srs_bytes": circuit.srs.stat().st_size,
        "zk_build_s": circuit.build_s,
    }
    body = {
        "bench": "zk",
        "machine": machine(),
        "config": {
            "model": "smollm2-135m",
            "quick": args.quick,
            "operation": f"shard {circuit.shard} layer {circuit.layer} input RMSNorm + q_proj "
            f"head {circuit.head} ({circuit.n_inputs} -> {circuit.n_outputs})",
            "ezkl": "23.0.5",
            "logrows": circuit.logrows,
            "num_rows": circuit.num_rows,
            "input_scale": circuit.input_scale,
            "param_scale": circuit.param_scale,
            "visibility": "input public, output public, params fixed",
            "width": args.width,
            "repeats": args.repeats,
            "circuit_built_this_run": built_now,
            "shared_box": "2 CPU cores shared with ~5 engineers running tests and devnets",
            "load_average_start": round(load_start, 2),
            "load_average_end": round(os.getloadavg()[0], 2),
        },
        "metrics": metrics,
        "targets": {},
    }
    print(json.dumps(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
