"""The node agent against an in-process fake committee: registration, heartbeats, leave, and
retries while a validator RPC is down (it must never crash on an unreachable peer)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from node.agent.agent import AgentConfig, FatalAgentError, NodeAgent, heartbeat_interval
from node.chain.committee_rpc import TxRejectedError
from node.retry import Backoff, Stopped, retry
from protocol.committee.registry import Heartbeat, Leave, RegisterNode
from protocol.errors import RemoteError, UnavailableError
from protocol.numerics import NUMERICS

pytestmark = pytest.mark.unit

KEY = "ab" * 32
CONFIG = AgentConfig(
    evm_address="0x" + "11" * 20,
    evm_signature="0x" + "22" * 65,
    model="sha256:" + "33" * 32,
    shards=(1,),
    endpoint="http://127.0.0.1:18100",
    capacity=4,
    poll_s=0.01,
    heartbeat_every=3,
    leave_timeout_s=2.0,
)


@dataclass
class FakeCommittee:
    """A committee that applies register/heartbeat/leave at once; `down` calls fail first."""

    down: int = 0  # the next N calls raise UnavailableError
    height_value: int = 10
    view: dict[str, Any] | None = None
    sent: list[Any] = field(default_factory=list)
    signer: str = KEY

    def _maybe_down(self) -> None:
        if self.down > 0:
            self.down -= 1
            raise UnavailableError("validator down")

    async def height(self) -> int:
        self._maybe_down()
        self.height_value += 1
        return self.height_value

    async def node(self, key: str) -> dict[str, Any] | None:
        self._maybe_down()
        return None if self.view is None else dict(self.view)

    async def params(self) -> dict[str, Any]:
        self._maybe_down()
        return {"genesis": {"heartbeat_timeout": 30}}

    async def submit(self, body: Any) -> Any:
        self._maybe_down()
        self.sent.append(body)
        if isinstance(body, RegisterNode):
            self.view = {"key": KEY, "status": "JOIN", "routable": False}
        elif isinstance(body, Heartbeat):
            if self.view and self.view["status"] == "LEFT":
                raise TxRejectedError("rpc", code=15, log_text="left")
            self.view = {**(self.view or {}), "status": "SERVING"}
        elif isinstance(body, Leave):
            self.view = {**(self.view or {}), "status": "LEFT"}
        return type("Submitted", (), {"hash": "AA", "nonce": len(self.sent)})()

    async def committed_code(self, tx_hash: str, *, timeout_s: float = 0) -> tuple[int, str]:
        return 0, ""


def _agent(committee: FakeCommittee, healthy_after: int = 0) -> NodeAgent:
    probes = {"n": 0}

    async def healthy() -> bool:
        probes["n"] += 1
        return probes["n"] > healthy_after

    return NodeAgent(CONFIG, committee, healthy=healthy, backoff=Backoff(0.001, 2, 0.01))


async def _run_until(agent: NodeAgent, condition: Any, timeout_s: float = 5.0) -> int:
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.005)
    stop.set()
    return await task


async def test_agent_registers_heartbeats_then_leaves_on_stop() -> None:
    committee = FakeCommittee()
    agent = _agent(committee, healthy_after=2)
    code = await _run_until(agent, lambda: agent.heartbeats >= 3)
    assert code == 0
    kinds = [type(b).__name__ for b in committee.sent]
    assert kinds[0] == "RegisterNode" and kinds[-1] == "Leave"
    assert kinds.count("Heartbeat") >= 3
    register = committee.sent[0]
    assert register.model == CONFIG.model and register.shards == (1,)
    assert register.endpoint == CONFIG.endpoint and register.capacity == 4
    assert committee.view is not None and committee.view["status"] == "LEFT"


async def test_agent_heartbeats_only_every_n_blocks() -> None:
    committee = FakeCommittee()
    agent = _agent(committee)
    await agent.heartbeat_if_due(100, 3, force=True)
    assert not await agent.heartbeat_if_due(101, 3)
    assert not await agent.heartbeat_if_due(102, 3)
    assert await agent.heartbeat_if_due(103, 3)
    assert agent.heartbeats == 2


async def test_agent_survives_validator_down_at_every_stage() -> None:
    committee = FakeCommittee(down=6)  # registration reads, params, heartbeats all fail first
    agent = _agent(committee)
    await _run_until(agent, lambda: agent.heartbeats >= 2)
    assert committee.down == 0
    assert isinstance(committee.sent[0], RegisterNode)
    assert committee.sent[0].numerics == NUMERICS  # announced to its verifiers


async def test_agent_keeps_running_through_an_outage_after_registration() -> None:
    committee = FakeCommittee()
    agent = _agent(committee)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    async with asyncio.timeout(5):
        while agent.heartbeats < 1:
            await asyncio.sleep(0.005)
        committee.down = 20  # the validator goes away for a while
        while committee.down > 0:
            await asyncio.sleep(0.005)
        before = agent.heartbeats
        while agent.heartbeats <= before:  # and heartbeats resume when it is back
            await asyncio.sleep(0.005)
    assert not task.done()
    stop.set()
    assert await task == 0


async def test_agent_restart_finds_registration_and_does_not_register_twice() -> None:
    committee = FakeCommittee(view={"key": KEY, "status": "DOWN", "routable": False})
    agent = _agent(committee)
    await _run_until(agent, lambda: agent.heartbeats >= 1)
    assert not any(isinstance(b, RegisterNode) for b in committee.sent)
    assert isinstance(committee.sent[0], Heartbeat)  # DOWN → heartbeat at once


async def test_agent_left_key_is_fatal_with_hint() -> None:
    committee = FakeCommittee(view={"key": KEY, "status": "LEFT"})
    agent = _agent(committee)
    code = await agent.run(asyncio.Event())
    assert code == FatalAgentError.exit_status
    assert committee.sent == []


async def test_agent_evm_address_taken_is_fatal() -> None:
    committee = FakeCommittee()

    async def taken(_hash: str, *, timeout_s: float = 0) -> tuple[int, str]:
        return 12, "bound to another node"

    committee.committed_code = taken  # type: ignore[method-assign]
    committee.submit = _submit_without_effect(committee)  # type: ignore[method-assign]
    assert await _agent(committee).run(asyncio.Event()) == FatalAgentError.exit_status


async def test_agent_numerics_not_accepted_is_fatal() -> None:
    committee = FakeCommittee()

    async def foreign(_hash: str, *, timeout_s: float = 0) -> tuple[int, str]:
        return 105, "numerics 2 is not accepted by this chain (genesis numerics [3])"

    committee.committed_code = foreign  # type: ignore[method-assign]
    committee.submit = _submit_without_effect(committee)  # type: ignore[method-assign]
    assert await _agent(committee).run(asyncio.Event()) == FatalAgentError.exit_status
    assert len(committee.sent) == 1  # not retried: only a release change helps


def _submit_without_effect(committee: FakeCommittee) -> Any:
    async def submit(body: Any) -> Any:
        committee.sent.append(body)
        return type("Submitted", (), {"hash": "AA", "nonce": 1})()

    return submit


async def test_agent_stopped_before_registration_sends_nothing() -> None:
    committee = FakeCommittee()
    stop = asyncio.Event()
    stop.set()
    assert await _agent(committee, healthy_after=10**9).run(stop) == 0
    assert committee.sent == []


async def test_retry_retries_transient_errors_then_returns() -> None:
    calls = {"n": 0}

    async def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 4:
            raise UnavailableError("down")
        return "ok"

    assert await retry(flaky, "x", Backoff(0.001, 2, 0.004), asyncio.Event()) == "ok"
    assert calls["n"] == 4


async def test_retry_lets_non_transient_errors_through_and_stops_on_stop() -> None:
    async def refused() -> None:
        raise RemoteError("peer", "nope", "refused")

    with pytest.raises(RemoteError):
        await retry(refused, "x", Backoff(0.001), asyncio.Event())
    stop = asyncio.Event()
    stop.set()
    with pytest.raises(Stopped):
        await retry(refused, "x", Backoff(0.001), stop)


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(initial_s=0.5, factor=2, max_s=3)
    assert [backoff.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3, 3]
    backoff.reset()
    assert backoff.next_delay() == 0.5


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"genesis": {"heartbeat_timeout": 30}}, 10),
        ({"genesis": {"heartbeat_timeout": 2}}, 1),
        ({"genesis": {"heartbeat_timeout": "30"}}, 10),  # not an int: the default (30)
        ({"genesis": {"heartbeat_timeout": -5}}, 10),
        ({"genesis": None}, 10),
        ([], 10),
    ],
)
def test_heartbeat_interval_is_a_third_of_a_sane_timeout(params: Any, expected: int) -> None:
    assert heartbeat_interval(params) == expected


async def test_agent_odd_height_answer_is_retried_not_fatal() -> None:
    committee = FakeCommittee()
    real_height = committee.height
    odd = {"n": 2}

    async def height() -> int:
        if odd["n"] > 0:
            odd["n"] -= 1
            raise ValueError("invalid literal for int()")
        return await real_height()

    committee.height = height  # type: ignore[method-assign]
    agent = _agent(committee)
    await _run_until(agent, lambda: agent.heartbeats >= 2)
    assert odd["n"] == 0
