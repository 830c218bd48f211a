"""The devnet's second model (issue 44): another SmolLM2 shard set, served by one seat in the
process of operator node0, so every devnet runs a multi-model node.

The set is `smollm2-135m-1p-int8` (the whole model as one int8 shard: another shard count is
another model hash), registered like the first (genesis `models`, `ModelRegistry.devRegister`)
and served by the gateway beside it (`--manifest` twice: a question names its model). Its node
is operator `seat0`: a home of its own (wallet, stake, node key: a seat is a registration of its
own, docs/network.md), joined with the operator's own commands, `planet stake` and then
`planet join --model M --shard 0 --into <node0's home>`, once node0 (joined with
`--memory-budget-mb`, so its node is a multi-model host) serves. The seat's join starts in the
background as soon as node0's host reports its first seat serving, while the other nodes still
join and `up` waits for the gateway (`SeatJoins`), and `up` ends once it is routable
(`SeatJoins.wait`). `--one-model` leaves all of it out.

Its cost: one more agent process, no more node processes (the seat is node0's process); the
gateway loads a second client part (~110 MB of embeddings and head); node0's process holds
~0.6 GB more (the int8 shard de-quantized). Its node charges like the others and the gateway
pays it from the same credits.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.committee.processes import log_tail
from deploy.devnet.hosts import SEAT_PORT, Placement
from deploy.devnet.plan import DevnetOptions, Progress
from deploy.devnet.processes import REPO_ROOT, StepFailed, free_ports, planet_argv
from node.procs import Child, spawn_process
from node.server.seats import read_status

SEAT_PREFIX = "seat"  # its operator homes: operators/seat<i> (not node<i>: those serve model 1)
HOST_OPERATOR = 0  # the operator whose node process takes the seat (node0)
# node0's memory budget: its own seat (shard 0 of the 3-part set, 2,380 MiB with the default
# KV caps) and the second model's (the 1-part set, ~2,800 MiB) fit; a third would not
HOST_MEMORY_BUDGET_MB = 8192


@dataclass
class SeatJoin:
    """A seat's `planet join --into`, running in the background."""

    name: str
    home: Path
    process: Child
    log_path: Path
    handle: Any  # the log file, closed when the join ends


class SeatJoins:
    """The seats' joins, started from a thread once node0's host serves its own seat (its
    status file lists a seat `serving`): their shard loads while the other nodes join."""

    def __init__(
        self,
        options: DevnetOptions,
        state: dict[str, Any],
        place: Placement,
        progress: Progress,
    ) -> None:
        self.joins: list[SeatJoin] = []
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._args = (options, state, place, progress)
        self._timeout_s = options.join_timeout_s + 30
        self._thread = threading.Thread(target=self._run, name="seat-joins", daemon=True)
        if seat_homes(options):
            self._thread.start()

    def _run(self) -> None:
        options, state, place, progress = self._args
        seats_file = Path(state["operators"][HOST_OPERATOR]) / "run" / "seats.json"
        deadline = time.monotonic() + self._timeout_s
        try:
            while not _host_serves(seats_file):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
                time.sleep(0.2)
            if not self._stop.is_set():
                self.joins = start_seat_joins(options, state, place, progress)
        except BaseException as error:  # reported by wait()
            self.failure = error

    def wait(self, progress: Progress) -> None:
        """Until every seat's join ended (a failed one fails `up`, naming its log)."""
        if not self._thread.is_alive() and not self._thread.ident:
            return  # no seats
        self._thread.join(self._timeout_s)
        if self.failure is not None:
            raise self.failure
        if not self.joins:
            options = self._args[0]
            raise StepFailed(
                "planet join --into",
                f"node{HOST_OPERATOR}'s node never served a seat",
                options.dir / "operators" / f"node{HOST_OPERATOR}" / "run" / "node-host.log",
            )
        await_seat_joins(self.joins, self._timeout_s, progress)

    def stop(self) -> None:
        """`up` failed: no join starts any more, those running are killed."""
        self._stop.set()
        if self._thread.ident:
            self._thread.join(5.0)
        stop_seat_joins(self.joins)


def _host_serves(seats_file: Path) -> bool:
    seats = read_status(seats_file).get("seats")
    return isinstance(seats, list) and any(
        isinstance(seat, dict) and seat.get("state") == "serving" for seat in seats
    )


def seat_homes(options: DevnetOptions) -> list[Path]:
    """The second model's operator homes (none with --one-model)."""
    if not options.with_second_model:
        return []
    return [options.dir / "operators" / f"{SEAT_PREFIX}0"]


def host_join_args(options: DevnetOptions, index: int) -> list[str]:
    """What operator `index`'s `planet join` adds: node0 hosts the second model's seat."""
    if index == HOST_OPERATOR and options.with_second_model:
        return ["--memory-budget-mb", str(HOST_MEMORY_BUDGET_MB)]
    return []


def start_seat_joins(
    options: DevnetOptions,
    state: dict[str, Any],
    place: Placement,
    progress: Progress,
) -> list[SeatJoin]:
    """Each seat home's `planet join --into node0`, started (node0 serves by now); await them
    with `await_seat_joins` (`SeatJoins` calls both)."""
    homes = seat_homes(options)
    if not homes:
        return []
    host_name = f"node{HOST_OPERATOR}"
    host_home = Path(state["operators"][HOST_OPERATOR])
    ports = (
        [SEAT_PORT + i for i in range(len(homes))]
        if place.on_hosts
        else free_ports(len(homes), 19000, 19900)
    )
    joins = []
    for index, home in enumerate(homes):
        argv = place.argv(host_name, planet_argv(
            "join",
            "--port", str(ports[index]),
            "--model", state["more_manifests"][index],
            "--shard", "0",
            "--into", str(host_home),
            "--home", str(home),
            "--password-file", state["password_file"],
            "--timeout", str(int(options.join_timeout_s)),
            "--credit-positions", str(options.node_price),
        ))  # fmt: skip
        log_path = home / "join.log"
        handle = log_path.open("wb")
        process = spawn_process(
            argv,
            handle.fileno(),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            cwd=REPO_ROOT,
            new_session=False,
        )
        joins.append(SeatJoin(home.name, home, process, log_path, handle))
        progress(f"      {home.name}: joining model 2 as a seat of {host_name}'s process")
    return joins


def await_seat_joins(joins: list[SeatJoin], timeout_s: float, progress: Progress) -> None:
    """Wait for each seat's join to end; a failed one fails `up`, naming its log."""
    try:
        for join in joins:
            try:
                code = join.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise StepFailed(
                    "planet join --into", f"{join.name} did not finish", join.log_path
                ) from None
            if code != 0:
                raise StepFailed(
                    "planet join --into",
                    f"`planet join --into` ({join.name})",
                    join.log_path,
                    detail=log_tail(join.log_path, 8),
                )
            progress(f"      {join.name}: routable (model 2, a seat of node{HOST_OPERATOR})")
    finally:
        stop_seat_joins(joins)


def stop_seat_joins(joins: list[SeatJoin]) -> None:
    """Kill the joins still running (their node and agent, if started, are `down`'s)."""
    for join in joins:
        if join.process.poll() is None:
            join.process.kill()
            join.process.wait()
        join.handle.close()
