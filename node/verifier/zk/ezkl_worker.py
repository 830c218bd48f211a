"""Runs ezkl steps inside ezkl's own virtualenv (`.tools/ezkl-venv`); stdlib + ezkl only.

Never imported by Planet's processes: `node.verifier.zk.engine` runs it as a script with the
ezkl venv's Python, so nothing else ever imports ezkl. One step per call:

    python ezkl_worker.py STEP ARGS.json RESULT.json

ARGS.json holds the step's paths and options; the step writes its result as JSON to RESULT.json
(ezkl prints tables on stdout, so stdout is not ours). Steps: `build`, `witness`, `prove`,
`verify`. Field elements cross this boundary as decimal strings of their canonical value.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import ezkl

FILES = {
    "onnx": "op.onnx",
    "settings": "settings.json",
    "compiled": "op.ezkl",
    "vk": "vk.key",
    "pk": "pk.key",
    "sol": "Halo2Verifier.sol",
    "abi": "Halo2Verifier.abi",
}


def _path(directory: str, name: str) -> str:
    return str(Path(directory) / FILES[name])


def _le_hex_to_int(text: str) -> int:
    """ezkl's JSON field elements are little-endian hex (64 digits, no prefix)."""
    return int.from_bytes(bytes.fromhex(text.removeprefix("0x")), "little")


def _int_to_le_hex(value: int) -> str:
    return value.to_bytes(32, "little").hex()


def build(args: dict[str, Any]) -> dict[str, Any]:
    directory, srs_dir = args["dir"], Path(args["srs_dir"])
    timings: dict[str, float] = {}
    run_args = ezkl.PyRunArgs()
    run_args.input_visibility = "public"
    run_args.output_visibility = "public"
    run_args.param_visibility = "fixed"
    run_args.input_scale = args["scale"]
    run_args.param_scale = args["scale"]
    started = time.monotonic()
    ezkl.gen_settings(_path(directory, "onnx"), _path(directory, "settings"), py_run_args=run_args)
    ezkl.calibrate_settings(
        args["sample"],
        _path(directory, "onnx"),
        _path(directory, "settings"),
        "resources",
        scales=[args["scale"]],
        max_logrows=args["max_logrows"],
    )
    ezkl.compile_circuit(
        _path(directory, "onnx"), _path(directory, "compiled"), _path(directory, "settings")
    )
    timings["settings_s"] = time.monotonic() - started
    settings = json.loads(Path(_path(directory, "settings")).read_text())
    logrows = int(settings["run_args"]["logrows"])
    srs = srs_dir / f"kzg{logrows}.srs"
    if not srs.is_file():  # generated locally: get_srs downloads (and fails offline)
        started = time.monotonic()
        srs_dir.mkdir(parents=True, exist_ok=True)
        partial = srs.with_suffix(f".partial-{os.getpid()}")
        ezkl.gen_srs(str(partial), logrows)
        partial.replace(srs)
        timings["srs_s"] = time.monotonic() - started
    started = time.monotonic()
    ezkl.setup(
        _path(directory, "compiled"),
        _path(directory, "vk"),
        _path(directory, "pk"),
        srs_path=str(srs),
    )
    timings["setup_s"] = time.monotonic() - started
    _write_verifier(directory, str(srs))
    return {
        "logrows": logrows,
        "srs": str(srs),
        "instance_shapes": settings["model_instance_shapes"],
        "input_scale": settings["run_args"]["input_scale"],
        "param_scale": settings["run_args"]["param_scale"],
        "num_rows": settings.get("num_rows"),
        "timings": timings,
    }


def _write_verifier(directory: str, srs: str) -> None:
    """The Solidity verifier of this vk. ezkl writes the .sol, then compiles it with a solc it
    fetches through svm (offline that fetch fails); we compile it ourselves with the repo's
    solc-js, so only the fetch error is tolerated, and only with a complete .sol on disk."""
    sol = Path(_path(directory, "sol"))

    async def create() -> None:
        await ezkl.create_evm_verifier(
            _path(directory, "vk"),
            _path(directory, "settings"),
            str(sol),
            _path(directory, "abi"),
            srs_path=srs,
        )

    try:
        asyncio.run(create())
    except RuntimeError as error:
        complete = sol.is_file() and sol.read_text().rstrip().endswith("}")
        if "svm error" not in str(error) or not complete:
            raise


def witness(args: dict[str, Any]) -> dict[str, Any]:
    directory = args["dir"]
    ezkl.gen_witness(args["input"], _path(directory, "compiled"), args["witness"])
    body = json.loads(Path(args["witness"]).read_text())
    return {
        "inputs": [str(_le_hex_to_int(v)) for v in body["inputs"][0]],
        "outputs": [str(_le_hex_to_int(v)) for v in body["outputs"][0]],
    }


def prove(args: dict[str, Any]) -> dict[str, Any]:
    directory = args["dir"]
    started, cpu = time.monotonic(), time.process_time()
    ezkl.prove(
        args["witness"],
        _path(directory, "compiled"),
        _path(directory, "pk"),
        args["proof"],
        srs_path=args["srs"],
    )
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    body = json.loads(Path(args["proof"]).read_text())
    return {
        "proof_hex": bytes(body["proof"]).hex(),
        "instances": [str(_le_hex_to_int(v)) for v in body["instances"][0]],
        "prove_s": elapsed,
        "prove_cpu_s": cpu,  # all threads: what the proof costs regardless of the box's load
    }


def verify(args: dict[str, Any]) -> dict[str, Any]:
    """Verifies a proof given as bytes + instances (the fault-proof blob's parts), by writing
    them into ezkl's proof-file shape."""
    directory = args["dir"]
    proof = bytes.fromhex(args["proof_hex"])
    body = {
        "protocol": None,
        "instances": [[_int_to_le_hex(int(v)) for v in args["instances"]]],
        "proof": list(proof),
        "hex_proof": "0x" + proof.hex(),
        "split": None,
        "pretty_public_inputs": None,
        "timestamp": None,
        "version": None,
    }
    Path(args["proof"]).write_text(json.dumps(body))
    started = time.monotonic()
    try:
        ok = bool(
            ezkl.verify(
                args["proof"],
                _path(directory, "settings"),
                _path(directory, "vk"),
                srs_path=args["srs"],
            )
        )
    except RuntimeError as error:  # ezkl raises on a proof that does not verify
        return {"ok": False, "error": str(error)[:500], "verify_s": time.monotonic() - started}
    return {"ok": ok, "verify_s": time.monotonic() - started}


STEPS = {"build": build, "witness": witness, "prove": prove, "verify": verify}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in STEPS:
        print(f"usage: ezkl_worker.py {{{','.join(STEPS)}}} ARGS.json RESULT.json", file=sys.stderr)
        return 2
    step, args_path, result_path = argv
    result = STEPS[step](json.loads(Path(args_path).read_text()))
    partial = Path(result_path + ".partial")
    partial.write_text(json.dumps(result))
    partial.replace(result_path)  # whole or absent: the engine reads it only after exit 0
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's shutdown: ezkl's native threads have aborted it after a finished
    # step ("PyGILState_Release: thread state … must be current", SIGABRT, in a clean-clone CI
    # of 02bef01), with the step's files and RESULT.json already written.
    os._exit(code)
