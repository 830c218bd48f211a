#!/usr/bin/env bash
# The README's test command: installs what it needs (deploy/setup.sh), then runs every check.
# Extra pytest arguments pass through: `bash deploy/test.sh -k frames`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
export PATH="$PWD/.venv/bin:$PWD/.tools/bin:$PWD/node_modules/.bin:$PATH"
# each step says when it started, in seconds since the command began (where the time goes)
step() { printf '\n== %s  [%d s]\n' "$*" "$SECONDS" >&2; }

# Bytecode caches for our own modules, compiled once here: the tests start hundreds of Python
# processes (nodes, validators, watchers, every `planet` command), and where the environment sets
# PYTHONDONTWRITEBYTECODE each one compiled the modules it imports from source again. Measured on
# test_local_cli (2-core machine, cpuacct): 41.7 and 44.3 CPU-s from source, 39.5 and 40.9
# compiled. The caches are gitignored.
unset PYTHONDONTWRITEBYTECODE
python -m compileall -q planet protocol shares abci_app node deploy harness bench

step "lint: ruff + import boundaries"
ruff check .
lint-imports --no-cache

# The contracts compile (offline solc-js, fails on a solc mismatch; ~11 s of one core) in the
# background while the model cache is checked and the lanes collect their tests: a lane starts
# its first test once they are compiled (the devnets deploy them: harness/lanes.py
# PLANET_LANE_AFTER); run in turn they held the lanes back ~12 s with a core idle. Then, in the
# same job, the Hardhat tests and slither, which need only the compiled contracts, beside the
# Python tests (~20 s of one core, mostly while the lanes wait on blocks and links); their output
# comes after the lanes' results. slither.config.json filters node_modules and contracts/test;
# accepted lows are justified in the contracts' comments. Any medium or high finding fails the run.
step "contracts: compile, then the Hardhat tests and slither, beside the Python tests"
contracts=$(mktemp -d "${TMPDIR:-/tmp}/planet-contracts.XXXXXX")
(
  if ! {
    npx hardhat compile &&
      # stale build-info files from earlier partial compiles would make slither analyse old code too
      { [ "$(find artifacts/build-info -name '*.json' | wc -l)" -le 1 ] || npx hardhat compile --force; }
  } >"$contracts/compile.log" 2>&1; then
    echo "the contracts did not compile (npx hardhat compile: its output ends this run's log)" >"$contracts/compiled.failed"
    exit 1
  fi
  touch "$contracts/compiled.ready"
  rc=0
  npx hardhat test || rc=1
  .tools/slither-venv/bin/slither . --hardhat-ignore-compile --fail-medium || rc=1
  exit "$rc"
) >"$contracts/log" 2>&1 &
contracts_pid=$!
compiled() { # waits for the contracts' compile: false when it failed
  while [ ! -e "$contracts/compiled.ready" ] && [ ! -e "$contracts/compiled.failed" ]; do
    kill -0 "$contracts_pid" 2>/dev/null || break
    sleep 0.2
  done
  [ -e "$contracts/compiled.ready" ]
}
contracts_result() { # the compile's, the Hardhat tests' and slither's output; fails when one failed
  local rc=0
  wait "$contracts_pid" || rc=$?
  if [ -e "$contracts/compiled.ready" ]; then
    step "contracts: Hardhat tests and slither, run beside the Python tests (exit $rc)"
  else
    step "contracts: the compile failed (exit $rc)"
  fi
  cat "$contracts/compile.log" "$contracts/log" >&2
  rm -rf "$contracts"
  return "$rc"
}

step "python: unit, integration and e2e tests"
if [ "$#" -gt 0 ]; then
  compiled || { contracts_result || true; exit 1; }
  # pytest in a process group of its own (job control on: a background job of a script otherwise
  # ignores SIGINT), so that a TERM (`timeout`, which signals its whole group; a CI cancel)
  # reaches this shell, which passes it on as an interrupt: pytest then tears its fixtures down
  # (the devnets' processes run in sessions of their own and outlived a pytest killed outright).
  set -m
  pytest tests --durations=30 "$@" &
  set +m
  pytest_pid=$!
  interrupted=0
  trap 'interrupted=1; kill -INT "$pytest_pid" 2>/dev/null' INT TERM
  rc=0
  wait "$pytest_pid" || rc=$?
  # a trapped signal ends `wait` early: wait again for pytest's own exit
  while kill -0 "$pytest_pid" 2>/dev/null; do
    rc=0
    wait "$pytest_pid" || rc=$?
  done
  trap - INT TERM
  if [ "$interrupted" = 1 ]; then
    step "interrupted: pytest exit $rc, its fixtures torn down; the Hardhat tests and slither stopped"
    kill 0 # this shell's process group: the contracts' job and this shell
  fi
  contracts_result || rc=1
  exit "$rc"
fi
# Lanes side by side: one test process alone leaves a core idle most of the time (waiting on
# blocks, links and other processes). $PLANET_TEST_LANES lanes (default 4) take whole modules
# from one queue, longest first by tests/durations.json (harness/lanes.py), until none is left;
# each lane runs in a network namespace of its own, so the lanes' devnets, fixed ports and
# servers never meet; the devnets' memory is shared out by harness/lanes.py's gate (four lanes
# with their devnets filled this 23 GiB machine), and each module's CPU and memory peak are
# metered (harness/unit_meter.py: the run ends with the modules that used most). PLANET_TEST_RECORD=1
# rewrites tests/durations.json from the run. Without root (no namespaces) two lanes split by marker instead: `e2e`
# (the devnets and the tests marked `e2e_lane`: the devnets' ports or network namespaces) and
# `rest`, each on its half of the test ports (harness/ports.py). Each line says its lane; every
# lane finishes, and the run fails if any does. The shared model cache is filled first, so the
# lanes never prepare the same shard set at once.
python -m harness.warm_models
step "lanes start"
# One intra-op thread per torch process in the lanes (every process a test starts inherits it;
# `planet node serve` already defaults to half the cores, 1 here): the two lanes keep both cores
# busy, and a 2-thread OpenMP process then spends its time waiting at barriers for a descheduled
# thread. Measured side by side on this 2-core machine under load (user CPU, wall), torch's
# default 2 threads -> 1: test_verifier_smollm2 52-56 s, 105-125 s -> 20-22 s, 35-70 s;
# test_model_prepare 72 s, 576 s -> 38 s, 406 s; test_paid_nodes (its nodes already at one
# thread) 95 s -> 94 s of CPU.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
lanes=$(mktemp -d "${TMPDIR:-/tmp}/planet-lanes.XXXXXX")
namespaces=()
stop_namespaces() {
  for ns in "${namespaces[@]}"; do
    left=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    if [ -n "$left" ]; then
      printf 'lane namespace %s: processes left running, killed: %s\n' "$ns" "$left" >&2
      kill -9 $left 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true
  done
}
trap 'stop_namespaces; kill 0' INT TERM
trap stop_namespaces EXIT
lane() {
  local name=$1
  shift
  {
    rc=0
    "$@" --durations=20 --basetemp="$lanes/$name" --junitxml="$lanes/$name.xml" 2>&1 |
      tee "$lanes/$name.log" || rc=$?
    echo "$rc" >"$lanes/$name.rc"
  } |
    sed -u "s/^/[$name] /"
}
# 4: the run is CPU-bound (the lanes end together); on a quiet 2-core machine (2026-12-06, one
# commit) 3 lanes took 1,057 s and 4 took 975 s, the fourth filling the gaps where the other
# three wait on blocks and epochs
count=${PLANET_TEST_LANES:-4}
lane_pids=()
probe="planet-probe-$$"
if [ "$(id -u)" = 0 ] && ip netns add "$probe" 2>/dev/null; then
  ip netns del "$probe"
  names=()
  for ((i = 0; i < count; i++)); do
    ns="planet-lane-$$-$i"
    ip netns add "$ns"
    namespaces+=("$ns")
    ip netns exec "$ns" ip link set lo up
    names+=("lane$i")
    # inside the namespace /sys has no cgroups: the meter (and the zygote, for the children it
    # forks) reaches them through this shell's root
    lane "lane$i" ip netns exec "$ns" env PLANET_LANE="$i/$count" PLANET_LANE_GATE="$lanes" \
      PLANET_CGROUPS="/proc/$$/root/sys/fs/cgroup" \
      PLANET_LANE_AFTER="$contracts/compiled" pytest tests -p harness.lanes &
    lane_pids+=($!)
  done
else
  compiled || { contracts_result || true; exit 1; }
  names=(e2e rest)
  PLANET_TEST_PORTS=10000-13999 lane e2e pytest tests -m "e2e or e2e_lane" &
  lane_pids+=($!)
  PLANET_TEST_PORTS=14000-17999 lane rest pytest tests -m "not (e2e or e2e_lane)" &
  lane_pids+=($!)
fi
# the lanes only (the contracts' job is waited for with its result)
wait "${lane_pids[@]}" || true
status=0
step "the lanes' results"
for name in "${names[@]}"; do
  rc=$(cat "$lanes/$name.rc" 2>/dev/null || echo 1)
  printf 'lane %s: pytest exit %s\n' "$name" "$rc" >&2
  # unprefixed, as pytest printed them, for whoever reads the run's failures from its end
  grep -E '^(FAILED|ERROR) |^=+ .*(passed|failed|error)' "$lanes/$name.log" || true
  [ "$rc" = 0 ] || status=1
done
contracts_result || status=1
if [ "${#namespaces[@]}" -gt 0 ]; then
  python -m harness.lanes check "$lanes"/lane*.log || status=1
  stop_namespaces
  namespaces=()
  python -m harness.unit_meter "$lanes"
fi
if [ "$status" = 0 ] && [ "${PLANET_TEST_RECORD:-0}" = 1 ]; then
  python -m harness.lanes record "$lanes"/*.xml >tests/durations.json
  printf 'tests/durations.json rewritten from this run\n' >&2
fi
step "done (exit $status)"
if [ "$status" = 0 ]; then rm -rf "$lanes"; else printf 'test files kept in %s\n' "$lanes" >&2; fi
exit "$status"
