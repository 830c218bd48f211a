"""The seats of a multi-model node process (node/server/host.py): the seats file, the memory
budget, and the status file the process writes.

A seat is one shard of one model served by the host process, with everything a single-shard
node has of its own: its `planet node serve` arguments (manifest, shard, port, node key, price,
credit spool, served-work spool), its sessions and KV caps, its TLS identity and so its own
registration on the committee (docs/network.md "Multi-model nodes").

The seats file is the operator's own file, `{"seats": [{"argv": [serve arguments...]}]}`,
written by `planet node add` (or by hand); the process reads it at start and again on SIGHUP,
and starts the seats it does not run yet. It is parsed into `SeatSpec`s or refused
(`BadSeatsFile`) all the same.

The memory budget counts, per seat, its weights as loaded (the shard file's bytes times
`RESIDENT_PER_FILE_BYTE` of its quantization: an int8 or int4 shard is de-quantized at load on
CPU, docs/compute.md) plus the seat's KV caps (`--max-cache-mb`, `--prefix-cache-mb`): what the
seat may hold at most. A seat that would take
the held total past the budget is refused by name (`MemoryBudgetExceeded`) before its shard is
loaded; the seats already serving are untouched.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.errors import ConfigError, UnavailableError, UsageError

STATUS_SUFFIX = ".status.json"
# resident bytes per shard-file byte once loaded on CPU (VmRSS after `ModelShardBackend` less
# before, SmolLM2-135M, this machine: fp32 0.07 (the file is mapped; its pages count once read,
# so 1), int8 5.7-5.8 (fp32 weights de-quantized at load), int4 16.4 (hqq); rounded up
RESIDENT_PER_FILE_BYTE = {"none": 1, "int8": 6, "int4": 17}
MAX_SEATS = 64
MAX_ARGS = 128
MAX_ARG_CHARS = 4096


class BadSeatsFile(ConfigError):
    code = "bad_seats_file"

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(
            f"{path}: {what}",
            hint='expected {"seats": [{"argv": ["--manifest", M, "--shard", K, ...]}]}',
        )


class MemoryBudgetExceeded(UnavailableError):
    """A seat does not fit in what the host's memory budget has left."""

    code = "memory_budget_exceeded"

    def __init__(self, cost: SeatCost, free: int, budget: int) -> None:
        super().__init__(
            f"shard {cost.shard} of {cost.model} needs {_mib(cost.bytes)} (weights "
            f"{_mib(cost.weight_bytes)} + KV caps {_mib(cost.bytes - cost.weight_bytes)}); the "
            f"node's memory budget has {_mib(free)} of {_mib(budget)} left",
            hint="raise --memory-budget-mb, lower the seat's --max-cache-mb/--prefix-cache-mb, "
            "or serve it from another node",
        )
        self.cost = cost


class SeatRefused(UnavailableError):
    """The host refused a seat (`planet node add`, `planet join --into`): its code and
    message."""

    code = "seat_refused"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(
            f"the node refused the seat: {message} ({code})",
            hint="see the node's log; the seat was taken out of the seats file again",
        )
        self.refusal = code


def _mib(count: int) -> str:
    return f"{count / 1024**2:.1f} MiB"


@dataclass(frozen=True, slots=True)
class SeatSpec:
    argv: tuple[str, ...]  # `planet node serve` arguments

    def to_json(self) -> dict[str, Any]:
        return {"argv": list(self.argv)}

    def port(self) -> int | None:
        """The `--port` it names (None: none, or not a number; parsing refuses it later)."""
        for flag, value in zip(self.argv, self.argv[1:], strict=False):
            if flag == "--port":
                return int(value) if value.isdigit() else None
        return None


@dataclass(frozen=True, slots=True)
class SeatCost:
    model: str  # model hash
    shard: int
    weight_bytes: int  # the shard file
    bytes: int  # weights + the seat's KV caps


def seat_cost(model: str, shard: int, weight_bytes: int, kv_cap_bytes: int) -> SeatCost:
    return SeatCost(model, shard, weight_bytes, weight_bytes + kv_cap_bytes)


def resident_weight_bytes(file_bytes: int, quant: str) -> int:
    """What a shard file of `quant` holds once loaded (an unknown quantization counts as the
    largest factor known)."""
    return file_bytes * RESIDENT_PER_FILE_BYTE.get(quant, max(RESIDENT_PER_FILE_BYTE.values()))


class MemoryBudget:
    """Bytes held by the seats of one process, keyed by port; `admit` refuses what does not
    fit. `budget` 0: no budget (every seat fits)."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ConfigError("the memory budget must be >= 0 bytes (0: none)")
        self.budget = budget
        self.held: dict[int, SeatCost] = {}

    def used(self) -> int:
        return sum(cost.bytes for cost in self.held.values())

    def free(self) -> int:
        return max(0, self.budget - self.used())

    def admit(self, port: int, cost: SeatCost) -> None:
        """Hold `cost` for the seat on `port`, or raise MemoryBudgetExceeded (nothing held)."""
        if port in self.held:
            raise ConfigError(f"port {port} already has a seat ({self.held[port].model})")
        if self.budget and cost.bytes > self.free():
            raise MemoryBudgetExceeded(cost, self.free(), self.budget)
        self.held[port] = cost

    def release(self, port: int) -> None:
        self.held.pop(port, None)


def read_seats(path: Path) -> list[SeatSpec]:
    """The seats file's seats, in order; BadSeatsFile when it is not one."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise BadSeatsFile(path, f"not readable JSON ({error})") from None
    if not isinstance(doc, dict) or set(doc) != {"seats"} or not isinstance(doc["seats"], list):
        raise BadSeatsFile(path, 'expected an object with one key, "seats" (a list)')
    if len(doc["seats"]) > MAX_SEATS:
        raise BadSeatsFile(path, f"more than {MAX_SEATS} seats")
    seats = []
    for i, entry in enumerate(doc["seats"]):
        argv = entry.get("argv") if isinstance(entry, dict) and set(entry) == {"argv"} else None
        if not (
            isinstance(argv, list)
            and 0 < len(argv) <= MAX_ARGS
            and all(isinstance(a, str) and len(a) <= MAX_ARG_CHARS for a in argv)
        ):
            raise BadSeatsFile(path, f'seat {i}: expected {{"argv": [strings]}}')
        seats.append(SeatSpec(tuple(argv)))
    return seats


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Replace `path` with `doc` at once (a reader never sees half a file)."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def append_seat(path: Path, seat: SeatSpec) -> None:
    """Add `seat` to the seats file (created when missing)."""
    seats = read_seats(path) if path.exists() else []
    write_json(path, {"seats": [s.to_json() for s in [*seats, seat]]})


def remove_seat(path: Path, port: int) -> bool:
    """Drop the seats on `port` from the seats file; whether any was there."""
    seats = read_seats(path)
    kept = [seat for seat in seats if seat.port() != port]
    write_json(path, {"seats": [s.to_json() for s in kept]})
    return len(kept) != len(seats)


def status_path(seats_file: Path) -> Path:
    return seats_file.with_name(seats_file.name + STATUS_SUFFIX)


def read_status(seats_file: Path) -> dict[str, Any]:
    """The host's last status (empty before its first pass, or unreadable)."""
    try:
        doc = json.loads(status_path(seats_file).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def host_pid(seats_file: Path) -> int | None:
    pid = read_status(seats_file).get("pid")
    return pid if type(pid) is int and pid > 0 else None


def wait_pass(seats_file: Path, after: int, timeout_s: float) -> dict[str, Any] | None:
    """The host's status once a pass later than `after` is written; None on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = read_status(seats_file)
        done = status.get("pass")
        if type(done) is int and done > after:
            return status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


def seat_entry(status: dict[str, Any], port: int) -> dict[str, Any] | None:
    for entry in status.get("seats", []):
        if isinstance(entry, dict) and entry.get("port") == port:
            return entry
    return None


def reload_host(seats_file: Path, pid: int, timeout_s: float) -> dict[str, Any]:
    """SIGHUP the host and return the status of its next pass; UnavailableError when it is not
    running or does not answer in time."""
    before = read_status(seats_file).get("pass", 0)
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise UnavailableError(f"the node (pid {pid}) is not running") from None
    status = wait_pass(seats_file, before if type(before) is int else 0, timeout_s)
    if status is None:
        raise UnavailableError(
            f"the node (pid {pid}) did not re-read {seats_file} in {timeout_s} s"
        )
    return status


def serving_entry(status: dict[str, Any], port: int) -> dict[str, Any]:
    """The seat on `port` as the host reports it serving; SeatRefused otherwise."""
    entry = seat_entry(status, port)
    if entry is None:
        raise SeatRefused("seat_missing", f"no seat on port {port} in the node's last pass")
    if entry.get("state") != "serving":
        raise SeatRefused(str(entry.get("code")), str(entry.get("message")))
    return entry


def add_seat(seats_file: Path, seat: SeatSpec, timeout_s: float) -> dict[str, Any]:
    """Append `seat` to a running host's seats file, signal it, and return the seat's serving
    entry; SeatRefused (memory budget, a bad shard, a taken port: the seat is taken out of the
    file again) or UnavailableError."""
    port = seat.port()
    if not port:
        raise UsageError("a seat names its own port: `--port P` (P > 0), as two words")
    pid = host_pid(seats_file)
    if pid is None:
        raise UnavailableError(
            f"no running node writes {status_path(seats_file)}",
            hint="start one first: planet node host --seats FILE (or planet join "
            "--memory-budget-mb N)",
        )
    append_seat(seats_file, seat)
    try:
        return serving_entry(reload_host(seats_file, pid, timeout_s), port)
    except SeatRefused:
        remove_seat(seats_file, port)  # not left behind to be tried at every later pass
        raise
