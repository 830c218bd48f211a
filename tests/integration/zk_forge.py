"""A forger's attempt, run with ezkl's own Python (.tools/ezkl-venv; stdlib + ezkl only): take an
honest witness of the ZK ticket's circuit, move output `index` by `delta` fixed-point steps,
and try to prove and verify that output with ezkl's prover. What a challenger who wants to frame
an honest node would need (tests/integration/test_zk_ticket.py asserts it fails).

    python zk_forge.py ARGS.json RESULT.json
    ARGS: {dir, witness, srs, index, delta, proof}   RESULT: {proved, verified, error}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ezkl

MODULUS = 21888242871839275222246405745257275088548364400416034343698204186575808495617


def _shift(le_hex: str, delta: int) -> str:
    value = int.from_bytes(bytes.fromhex(le_hex.removeprefix("0x")), "little")
    return ((value + delta) % MODULUS).to_bytes(32, "little").hex()


def main(args_path: str, result_path: str) -> int:
    args = json.loads(Path(args_path).read_text())
    directory = Path(args["dir"])
    witness = json.loads(Path(args["witness"]).read_text())
    outputs = witness["outputs"][0]
    outputs[args["index"]] = _shift(outputs[args["index"]], args["delta"])
    forged = Path(args["proof"]).with_name("forged-witness.json")
    forged.write_text(json.dumps(witness))
    result = {"proved": False, "verified": False, "error": ""}
    try:
        ezkl.prove(
            str(forged),
            str(directory / "op.ezkl"),
            str(directory / "pk.key"),
            args["proof"],
            srs_path=args["srs"],
        )
        result["proved"] = Path(args["proof"]).is_file()
    except Exception as error:
        result["error"] = f"prove: {error}"[:500]
    if result["proved"]:
        try:
            result["verified"] = bool(
                ezkl.verify(
                    args["proof"],
                    str(directory / "settings.json"),
                    str(directory / "vk.key"),
                    srs_path=args["srs"],
                )
            )
        except Exception as error:
            result["error"] = f"verify: {error}"[:500]
    Path(result_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
