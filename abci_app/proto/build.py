"""Generate the CometBFT ABCI protobuf classes into `abci_app/proto/gen/` (never committed).

The .proto sources come from the Go module cache that `go install cometbft@v0.38.25` filled
(`$(go env GOMODCACHE)/github.com/cometbft/cometbft@v0.38.25/proto` plus gogoproto's
`gogoproto/gogo.proto`). `deploy/setup.sh` runs this once (stamped); run it by hand with

    .venv/bin/python -m abci_app.proto.build [--modcache DIR]

It compiles `tendermint/abci/types.proto` and everything it imports (crypto, types, version,
gogoproto) with `grpc_tools.protoc`, then drops an `__init__.py` into every generated package.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from protocol.errors import ConfigError

log = logging.getLogger(__name__)

COMETBFT_VERSION = "0.38.25"
GOGOPROTO_VERSION = "1.7.0"
GEN_DIR = Path(__file__).resolve().parent / "gen"
# types.proto's transitive imports, listed so every one gets its own _pb2 module.
PROTO_FILES = (
    "tendermint/abci/types.proto",
    "tendermint/crypto/proof.proto",
    "tendermint/crypto/keys.proto",
    "tendermint/types/types.proto",
    "tendermint/types/params.proto",
    "tendermint/types/validator.proto",
    "tendermint/types/canonical.proto",
    "tendermint/version/types.proto",
    "gogoproto/gogo.proto",
)


def go_modcache() -> Path:
    """The Go module cache directory (`GOMODCACHE`, else `go env GOMODCACHE`, else ~/go/pkg/mod)."""
    env = os.environ.get("GOMODCACHE")
    if env:
        return Path(env)
    go = shutil.which("go")
    if go:
        out = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.strip():
            return Path(out.stdout.strip())
    return Path.home() / "go" / "pkg" / "mod"


def build(modcache: Path, out_dir: Path = GEN_DIR) -> Path:
    """Compile the ABCI protos from `modcache` into `out_dir`; returns `out_dir`."""
    comet = modcache / "github.com" / "cometbft" / f"cometbft@v{COMETBFT_VERSION}" / "proto"
    gogo = modcache / "github.com" / "cosmos" / f"gogoproto@v{GOGOPROTO_VERSION}"
    for path in (comet / PROTO_FILES[0], gogo / "gogoproto" / "gogo.proto"):
        if not path.is_file():
            raise ConfigError(
                f"missing {path}",
                hint=f"run `go mod download github.com/cometbft/cometbft@v{COMETBFT_VERSION}`",
            )
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the dev extras
        raise ConfigError("grpcio-tools is not installed", hint="run bash deploy/setup.sh") from exc
    include = Path(protoc.__file__).resolve().parent / "_proto"
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    args = [
        "grpc_tools.protoc",
        f"-I{comet}",
        f"-I{gogo}",
        f"-I{include}",
        f"--python_out={tmp}",
        *PROTO_FILES,
    ]
    code = protoc.main(args)
    if code != 0:
        raise ConfigError(f"protoc failed with exit status {code} (args: {' '.join(args)})")
    for directory in [tmp, *[p for p in tmp.rglob("*") if p.is_dir()]]:
        (directory / "__init__.py").touch()
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    log.info("generated ABCI protobuf classes dir=%s", out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modcache", type=Path, default=None, help="Go module cache directory")
    parser.add_argument("--out", type=Path, default=GEN_DIR, help="output directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    try:
        build(args.modcache or go_modcache(), args.out)
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_status
    return 0


if __name__ == "__main__":
    sys.exit(main())
