"""Builds (once) and caches the ezkl circuit of a `NormSliceOp`: ONNX → settings → compiled
circuit → SRS (generated locally) → proving/verifying keys → the Solidity verifier, compiled with
the repository's solc-js. Nothing built here is committed.

    circuit = build_circuit(op, spec, sample)      # [1, H] float32 calibration sample
    circuit.dir / "pk.key", circuit.verifier, circuit.n_inputs, circuit.n_outputs

Cache: `$PLANET_HOME/zk/<spec.digest>-s<scale>-ezkl<version>/` (default `~/.cache/planet/zk`: one
per machine, like the prepared models, so a fresh checkout finds the circuits built; a clean
clone's test run built both circuits again, ~67 CPU-s), one directory per circuit, built in a
`.partial-<pid>` sibling and renamed when complete (`circuit.json` inside marks it), and
`$PLANET_HOME/zk/srs/kzg<logrows>.srs`, generated locally and shared by all circuits. A new setup
changes the verifying key, so the verifier contract is always generated from the keys in the
same directory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from node.model.source import planet_home
from node.verifier.zk.circuit import NormSliceOp, OpSpec
from node.verifier.zk.engine import (
    EZKL_VERSION,
    REPO_ROOT,
    ZkStepError,
    ezkl_site_packages,
    run_step,
)
from protocol.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_SCALE = 7  # fixed point: value = integer / 2^scale
MAX_LOGROWS = 17
CIRCUIT_FILE = "circuit.json"
VERIFIER_FILE = "Halo2Verifier.compiled.json"
EXPORT_TIMEOUT_S = 300
SOLC_TIMEOUT_S = 300

# Standard-JSON compile through the repository's pinned solc-js (no download, no svm).
_SOLC_JS = """
const solc = require('solc');
let input = '';
process.stdin.on('data', (chunk) => { input += chunk; });
process.stdin.on('end', () => { process.stdout.write(solc.compile(input)); });
"""


@dataclass(frozen=True)
class BuiltCircuit:
    """A built circuit: where its files are and what the adapter contract must be told."""

    dir: Path
    digest: str
    manifest_hash: bytes
    shard: int
    layer: int
    head: int
    n_inputs: int
    n_outputs: int
    input_scale: int
    param_scale: int
    logrows: int
    srs: Path
    num_rows: int | None
    build_s: float

    def path(self, name: str) -> Path:
        return self.dir / name

    @property
    def verifier(self) -> dict[str, Any]:
        """{"abi": [...], "bytecode": "0x…"} of the generated Halo2Verifier."""
        return json.loads((self.dir / VERIFIER_FILE).read_text())

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body.update(dir=str(self.dir), srs=str(self.srs), manifest_hash=self.manifest_hash.hex())
        return body

    @classmethod
    def load(cls, directory: Path) -> BuiltCircuit:
        body = json.loads((directory / CIRCUIT_FILE).read_text())
        body.update(
            dir=directory, srs=Path(body["srs"]), manifest_hash=bytes.fromhex(body["manifest_hash"])
        )
        return cls(**body)


def cache_root() -> Path:
    return planet_home() / "zk"


def build_circuit(
    op: NormSliceOp,
    spec: OpSpec,
    sample: torch.Tensor,
    *,
    scale: int = DEFAULT_SCALE,
    root: Path | None = None,
) -> BuiltCircuit:
    """The cached circuit for (`spec`, `scale`), built first if needed (minutes: SRS + setup).
    `sample` [1, H] calibrates the fixed-point settings; it does not name the circuit."""
    root = root or cache_root()
    target = root / f"{spec.digest}-s{scale}-ezkl{EZKL_VERSION}"
    if (target / CIRCUIT_FILE).is_file():
        return BuiltCircuit.load(target)
    if sample.shape != (1, spec.hidden_size):
        raise ConfigError(f"calibration sample must be [1, {spec.hidden_size}]")
    started = time.monotonic()
    staging = root / f"{target.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    log.info("zk build circuit=%s dir=%s", spec.digest, target)
    torch.save(
        {"norm_weight": op.norm_weight.detach(), "rows": op.rows.detach(), "eps": op.eps},
        staging / "op.pt",
    )
    _export(staging)
    (staging / "sample.json").write_text(json.dumps({"input_data": [sample.reshape(-1).tolist()]}))
    built = run_step(
        "build",
        {
            "dir": str(staging),
            "sample": str(staging / "sample.json"),
            "srs_dir": str(root / "srs"),
            "scale": scale,
            "max_logrows": MAX_LOGROWS,
        },
    )
    (staging / VERIFIER_FILE).write_text(
        json.dumps(compile_verifier(staging / "Halo2Verifier.sol"))
    )
    shapes = built["instance_shapes"]
    circuit = BuiltCircuit(
        dir=target,
        digest=spec.digest,
        manifest_hash=spec.manifest_hash,
        shard=spec.shard,
        layer=spec.layer,
        head=spec.head,
        n_inputs=_count(shapes[0]),
        n_outputs=_count(shapes[1]),
        input_scale=int(built["input_scale"]),
        param_scale=int(built["param_scale"]),
        logrows=int(built["logrows"]),
        srs=Path(built["srs"]),
        num_rows=built.get("num_rows"),
        build_s=round(time.monotonic() - started, 1),
    )
    if (circuit.n_inputs, circuit.n_outputs) != (spec.hidden_size, spec.width):
        raise ConfigError(f"ezkl made instances {shapes}, expected [1, H] and [1, W]")
    (staging / CIRCUIT_FILE).write_text(json.dumps(circuit.to_json()))
    try:
        staging.replace(target)
    except OSError:  # another process finished the same build first: use theirs
        shutil.rmtree(staging, ignore_errors=True)
    log.info("zk built circuit=%s in %.1f s", spec.digest, circuit.build_s)
    return BuiltCircuit.load(target)


def _count(shape: list[int]) -> int:
    total = 1
    for size in shape:
        total *= int(size)
    return total


def _export(directory: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "node.verifier.zk.export_onnx",
            str(directory / "op.pt"),
            str(directory / "op.onnx"),
            ezkl_site_packages(),
        ],
        capture_output=True,
        text=True,
        timeout=EXPORT_TIMEOUT_S,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    if done.returncode != 0:
        raise ZkStepError("export", done.returncode, done.stderr)


def compile_verifier(source: Path) -> dict[str, Any]:
    """ABI and creation bytecode of the generated `Halo2Verifier` (solc-js from node_modules,
    optimizer on, EVM cancun as in hardhat.config.js)."""
    request = {
        "language": "Solidity",
        "sources": {"Halo2Verifier.sol": {"content": source.read_text()}},
        "settings": {
            "optimizer": {"enabled": True, "runs": 200},
            "evmVersion": "cancun",
            "outputSelection": {"*": {"Halo2Verifier": ["abi", "evm.bytecode.object"]}},
        },
    }
    done = subprocess.run(
        ["node", "-e", _SOLC_JS],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=SOLC_TIMEOUT_S,
        cwd=REPO_ROOT,
    )
    if done.returncode != 0:
        raise ZkStepError("solc", done.returncode, done.stderr)
    output = json.loads(done.stdout)
    errors = [e for e in output.get("errors", []) if e.get("severity") == "error"]
    if errors:
        raise ZkStepError("solc", 1, "; ".join(e.get("formattedMessage", "") for e in errors))
    contract = output["contracts"]["Halo2Verifier.sol"]["Halo2Verifier"]
    return {"abi": contract["abi"], "bytecode": "0x" + contract["evm"]["bytecode"]["object"]}
