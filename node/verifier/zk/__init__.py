"""ZK tickets (issue 16 item 6): an ezkl proof about one small operation of the model, judged
on chain through the FraudProofs fault-verifier hook.

    circuit.py      NormSliceOp (our PyTorch module: RMSNorm + one query head) and OpSpec
    build.py        ONNX export → ezkl settings/circuit/SRS/keys → Solidity verifier (cached)
    engine.py       ezkl runs in its own venv (.tools/ezkl-venv) through ezkl_worker.py
    prover.py       what a node signs for the operation; proofs bound to a signed reveal
    verify.py       the adapter's checks in Python, ezkl's verifier for the proof
    inputs.py       a real input: the hidden state the shard receives

The hashes a node signs and the fault-proof layout are in protocol/zkticket.py; the on-chain
judge is contracts/zk/EzklFaultVerifier.sol (deployed by deploy/zk.py). Nothing here imports
ezkl; only ezkl_worker.py does, inside ezkl's venv.
"""
