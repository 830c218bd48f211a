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

The memory budget counts, per seat, the shard file's bytes (its weights) plus the seat's KV caps
(`--max-cache-mb`, `--prefix-cache-mb`): what the seat may hold at most. A seat that would take
the held total past the budget is refused by name (`MemoryBudgetExceeded`) before its shard is
loaded; the seats already serving are untouched.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.errors import ConfigError, UnavailableError

STATUS_SUFFIX = ".status.json"
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


def _mib(count: int) -> str:
    return f"{count / 1024**2:.1f} MiB"


@dataclass(frozen=True, slots=True)
class SeatSpec:
    argv: tuple[str, ...]  # `planet node serve` arguments

    def to_json(self) -> dict[str, Any]:
        return {"argv": list(self.argv)}


@dataclass(frozen=True, slots=True)
class SeatCost:
    model: str  # model hash
    shard: int
    weight_bytes: int  # the shard file
    bytes: int  # weights + the seat's KV caps


def seat_cost(model: str, shard: int, weight_bytes: int, kv_cap_bytes: int) -> SeatCost:
    return SeatCost(model, shard, weight_bytes, weight_bytes + kv_cap_bytes)


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
            raise BadSeatsFile(path, f"seat {i}: expected {{\"argv\": [strings]}}")
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


def status_path(seats_file: Path) -> Path:
    return seats_file.with_name(seats_file.name + STATUS_SUFFIX)
