"""`NodeAgent`: registers a compute node on the committee chain, heartbeats, leaves on shutdown.

Lifecycle (docs/committee.md): register_node → JOIN, heartbeat → SERVING, no heartbeat for
more than T blocks → DOWN, leave → LEFT (final). The agent

1. waits until its compute node answers `GET {endpoint}/health`;
2. registers the node key (once; a restart finds the key registered and goes on), bound to the
   operator's staking address by an EIP-191 signature of that address's key;
3. sends a heartbeat whenever `heartbeat_every` blocks have passed since the last one (a third
   of the chain's `heartbeat_timeout` by default), or at once when the chain says DOWN/JOIN;
4. registers the node's price on the chain (`pricing.py`: positions per credit, 0 = free)
   and redeems the credits its clients paid with (`credit_till.py`): the node's only pay;
5. when it rebalances (joined with auto placement, or `--rebalance`), looks at its model's
   pool and moves to a shard that gains from it (`mover.Rebalancer`, `rebalance.decide`);
   when the registration announces other numerics than this release's (an upgraded node),
   announces this release's (`numerics_keeper.NumericsKeeper`: `set_numerics` once the
   chain's cooldown allows it; off with `--no-auto-numerics` / PLANET_AUTO_NUMERICS=0);
6. on stop (SIGTERM/SIGINT) sends `leave` and waits for it to commit (bounded).

A validator RPC that is down is retried with backoff (and the next URL tried); nothing a
validator answers makes the agent crash. Only facts that no retry can change stop it with a
`FatalAgentError`: the key has LEFT (final on chain), or the EVM address is bound to another key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from node.chain.committee_rpc import TxRejectedError
from node.retry import Backoff, Stopped, retry, sleep_or_stop
from protocol.committee.registry import Heartbeat, Leave, RegisterNode, Rendezvous
from protocol.errors import PlanetError, RemoteError, UnavailableError
from protocol.numerics import NUMERICS, NumericsError, announced_at

log = logging.getLogger(__name__)

# FinalizeBlock codes the agent acts on (abci_app/codes.py)
OK, BAD_EVM_SIGNATURE, ALREADY_REGISTERED, EVM_ADDRESS_TAKEN, INVALID_LIFECYCLE = 0, 4, 11, 12, 15
NUMERICS_NOT_ACCEPTED = 105  # the chain's genesis does not list this release's numerics
LEFT = "LEFT"
# What a validator may answer while it is overloaded, restarting or catching up: retried.
TRANSIENT = (UnavailableError, RemoteError)


DEFAULT_HEARTBEAT_TIMEOUT = 30  # blocks (docs/committee.md)


def heartbeat_interval(params: Any) -> int:
    """A third of the chain's `heartbeat_timeout` (from `/params`), at least 1 block; the
    default timeout when the answer does not carry a sane one."""
    genesis = params.get("genesis") if isinstance(params, dict) else None
    timeout = genesis.get("heartbeat_timeout") if isinstance(genesis, dict) else None
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 0 < timeout < 2**31:
        log.warning(
            "no usable heartbeat_timeout in /params; assuming %d blocks", DEFAULT_HEARTBEAT_TIMEOUT
        )
        timeout = DEFAULT_HEARTBEAT_TIMEOUT
    return max(1, timeout // 3)


class FatalAgentError(PlanetError):
    """A chain fact that retrying cannot change (the process exits with this message)."""

    code = "agent_fatal"
    exit_status = 3


class Link(Protocol):
    """What the agent needs from the committee chain (`node.chain.committee_link.CommitteeLink`)."""

    signer: str

    async def height(self) -> int: ...
    async def node(self, key: str) -> dict[str, Any] | None: ...
    async def params(self) -> dict[str, Any]: ...
    async def submit(self, body: Any) -> Any: ...
    async def committed_code(self, tx_hash: str, *, timeout_s: float = ...) -> tuple[int, str]: ...


@dataclass(frozen=True)
class AgentConfig:
    """What the node serves and how often the agent talks to the chain."""

    evm_address: str  # the staking wallet's address (checksummed)
    evm_signature: str  # EIP-191 registration signature by that wallet (0x + 130 hex)
    model: str  # the manifest's model_hash (e.g. sha256:<64 hex>)
    shards: tuple[int, ...]  # shard indexes served
    endpoint: str  # the compute node's base URL
    capacity: int  # max concurrent sessions
    role: str = "compute"
    poll_s: float = 1.0  # seconds between looks at the chain height
    heartbeat_every: int = 0  # blocks between heartbeats; 0: a third of heartbeat_timeout
    leave_timeout_s: float = 15.0  # how long shutdown may spend getting `leave` committed
    commit_timeout_s: float = 15.0  # how long to wait for a registration to commit
    # the relays fronting a node behind NAT, registered with it (docs/overlay.md)
    rendezvous: tuple[Rendezvous, ...] = ()
    # whether this agent rebalances (registered as `rebalances`: a node that does not is never
    # chosen as a swap's partner, node/agent/rebalance.py); None: not announced
    rebalances: bool | None = None


class NodeAgent:
    def __init__(
        self,
        config: AgentConfig,
        link: Link,
        *,
        healthy: Callable[[], Awaitable[bool]],
        backoff: Backoff | None = None,
        committer: Any = None,
        redeemer: Any = None,
        pricer: Any = None,
    ) -> None:
        self.config = config
        self.link = link
        self.healthy = healthy
        self.backoff = backoff or Backoff()
        self.key = link.signer
        self.status: str | None = None
        self.last_heartbeat_height = 0
        self.heartbeats = 0
        # commit-reveal of served work (node.agent.commitments.Committer), None: nothing to commit
        self.committer = committer
        self.epoch_length = 0
        self.retention_epochs = 10
        # `node.agent.credit_till.SpoolRedeemer` (None: the node is not paid with credits)
        self.redeemer = redeemer
        # `node.agent.pricing.PriceKeeper` (None: the node registers no price)
        self.pricer = pricer
        # `node.agent.mover.Rebalancer` (None: the node stays on its shard)
        self.rebalancer: Any = None
        # `node.agent.numerics_keeper.NumericsKeeper` (None: the operator announces by hand)
        self.numerics: Any = None
        self._stop = asyncio.Event()

    # -- steps ---------------------------------------------------------------------------------

    async def wait_healthy(self, stop: asyncio.Event) -> None:
        async def probe() -> bool:
            if not await self.healthy():
                raise UnavailableError(f"compute node {self.config.endpoint} is not healthy yet")
            return True

        # The node is local and cheap to probe: look often while its shard loads.
        await retry(probe, "reach the compute node", Backoff(0.25, 2.0, 2.0), stop)

    async def heartbeat_interval(self, stop: asyncio.Event) -> int:
        if self.config.heartbeat_every > 0 and self.committer is None:
            return self.config.heartbeat_every
        params = await retry(
            self.link.params, "read chain params", self.backoff, stop, transient=TRANSIENT
        )
        self._note_epochs(params)
        if self.config.heartbeat_every > 0:
            return self.config.heartbeat_every
        return heartbeat_interval(params)

    def _note_epochs(self, params: Any) -> None:
        genesis = params.get("genesis") if isinstance(params, dict) else None
        if isinstance(genesis, dict):
            length, keep = genesis.get("epoch_length"), genesis.get("retention_epochs")
            if type(length) is int and 0 < length < 2**31:
                self.epoch_length = length
            if type(keep) is int and 0 < keep < 2**31:
                self.retention_epochs = keep

    async def ensure_registered(self, stop: asyncio.Event) -> dict[str, Any]:
        """Register unless the key already is; returns the committee's view of the node."""
        while True:
            view = await retry(
                lambda: self.link.node(self.key),
                "read node",
                self.backoff,
                stop,
                transient=TRANSIENT,
            )
            if view is not None:
                if view.get("status") == LEFT:
                    raise FatalAgentError(
                        f"node key {self.key[:16]}… has LEFT the network (final on chain)",
                        hint="a node key and its staking address join once; join again with a "
                        "new wallet and node key (another PLANET_HOME)",
                    )
                self._note_status(view)
                if self.numerics is None:
                    _note_numerics(view)  # else the keeper announces this release's itself
                return view
            body = RegisterNode(
                evm_address=self.config.evm_address,
                evm_signature=self.config.evm_signature,
                role=self.config.role,
                model=self.config.model,
                shards=self.config.shards,
                endpoint=self.config.endpoint,
                capacity=self.config.capacity,
                rendezvous=self.config.rendezvous,
                numerics=NUMERICS,  # what its verifiers compare bitwise against
                rebalances=self.config.rebalances,  # False: pinned, never a swap's partner
            )
            code, text = await self._submit_and_wait(body, stop)
            if code in (OK, ALREADY_REGISTERED):
                log.info(
                    "registered node=%s model=%s shards=%s endpoint=%s",
                    self.key[:16],
                    self.config.model,
                    list(self.config.shards),
                    self.config.endpoint,
                )
                continue  # read the view back
            if code == EVM_ADDRESS_TAKEN:
                raise FatalAgentError(
                    f"the staking address {self.config.evm_address} is bound to another node key",
                    hint="each staking wallet registers one node key; use that key's home or "
                    "a new wallet",
                )
            if code == BAD_EVM_SIGNATURE:
                raise FatalAgentError(f"the chain refused the registration signature: {text}")
            if code == NUMERICS_NOT_ACCEPTED:
                raise FatalAgentError(
                    f"the chain does not accept this release's numerics {NUMERICS}: {text}",
                    hint="run the release the network's verifiers run (its committee's /params "
                    "lists the accepted versions under genesis.numerics)",
                )
            log.warning("registration refused code=%d log=%s; retrying", code, text)
            if await sleep_or_stop(stop, self.backoff.next_delay()):
                raise Stopped("stopped while registering")

    async def _submit_and_wait(self, body: Any, stop: asyncio.Event) -> tuple[int, str]:
        async def once() -> tuple[int, str]:
            try:
                submitted = await self.link.submit(body)
            except TxRejectedError as error:
                return error.tx_code, error.log_text
            return await self.link.committed_code(
                submitted.hash, timeout_s=self.config.commit_timeout_s
            )

        return await retry(once, f"send {body.TYPE}", self.backoff, stop, transient=TRANSIENT)

    async def send(self, body: Any) -> tuple[int, str]:
        """Submit a tx signed by the node key and wait for its FinalizeBlock code (the
        rebalancer's `move_shards`); retried while the committee does not answer."""
        return await self._submit_and_wait(body, self._stop)

    def _note_status(self, view: dict[str, Any]) -> None:
        status = view.get("status")
        if status != self.status:
            log.info(
                "node=%s status=%s stake=%s reputation=%s routable=%s",
                self.key[:16],
                status,
                view.get("stake"),
                view.get("reputation"),
                view.get("routable"),
            )
            self.status = status

    async def heartbeat_if_due(self, height: int, interval: int, force: bool = False) -> bool:
        """Send a heartbeat when `interval` blocks passed since the last one (or `force`)."""
        if not force and height - self.last_heartbeat_height < interval:
            return False
        try:
            await self.link.submit(Heartbeat())
        except TxRejectedError as error:
            if error.tx_code == INVALID_LIFECYCLE:
                raise FatalAgentError(
                    f"node {self.key[:16]}… has LEFT; heartbeats refused"
                ) from None
            log.warning("heartbeat refused code=%d log=%s", error.tx_code, error.log_text)
            return False
        self.last_heartbeat_height = height
        self.heartbeats += 1
        log.debug("heartbeat height=%d", height)
        return True

    async def leave(self) -> bool:
        """Send `leave` and wait for it to commit, within `leave_timeout_s`. True on success."""
        try:
            async with asyncio.timeout(self.config.leave_timeout_s):
                while True:
                    try:
                        submitted = await self.link.submit(Leave())
                        code, text = await self.link.committed_code(
                            submitted.hash, timeout_s=self.config.leave_timeout_s
                        )
                    except TxRejectedError as error:
                        code, text = error.tx_code, error.log_text
                    except TRANSIENT as error:
                        log.warning("leave: %s; retrying", error.message)
                        await asyncio.sleep(self.backoff.next_delay())
                        continue
                    if code in (OK, INVALID_LIFECYCLE):
                        log.info("left the network node=%s", self.key[:16])
                        return True
                    log.warning("leave refused code=%d log=%s", code, text)
                    return False
        except TimeoutError:
            log.error("leave not committed within %.0f s", self.config.leave_timeout_s)
            return False

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, leave_on_stop: bool = True) -> int:
        """Until `stop`: register, then heartbeat. Returns the process exit status."""
        self._stop = stop
        try:
            await self.wait_healthy(stop)
            view = await self.ensure_registered(stop)
            interval = await self.heartbeat_interval(stop)
            log.info("heartbeat every %d blocks", interval)
            force = view.get("status") != "SERVING"
            checks = 0
            while not stop.is_set():
                try:
                    height = await self.link.height()
                    if await self.heartbeat_if_due(height, interval, force=force):
                        force = False
                    if self.committer is not None and self.epoch_length > 0:
                        await self.committer.step(height, self.epoch_length, self.retention_epochs)
                    if self.pricer is not None:
                        await self.pricer.step()
                    if self.redeemer is not None:
                        await self.redeemer.step()
                    if self.rebalancer is not None:
                        await self.rebalancer.step(height, stop)
                    checks += 1
                    if checks % 5 == 1:
                        view = await self.link.node(self.key)
                        if view is not None:
                            self._note_status(view)
                            force = force or view.get("status") in ("DOWN", "JOIN")
                            if view.get("status") == LEFT:
                                raise FatalAgentError(f"node {self.key[:16]}… has LEFT")
                            if self.numerics is not None:
                                await self.numerics.step(view, height)
                    self.backoff.reset()
                    delay = self.config.poll_s
                except (UnavailableError, RemoteError) as error:
                    delay = self.backoff.next_delay()
                    log.warning("committee: %s; retry_in_s=%.1f", error.message, delay)
                    force = True  # a heartbeat may have been missed meanwhile
                except (KeyError, TypeError, ValueError) as error:  # an odd answer: never fatal
                    delay = self.backoff.next_delay()
                    log.warning("committee answered oddly: %r; retry_in_s=%.1f", error, delay)
                    force = True
                await sleep_or_stop(stop, delay)
        except Stopped:
            pass
        except FatalAgentError as error:
            log.error("%s%s", error.message, f" (hint: {error.hint})" if error.hint else "")
            return error.exit_status
        finally:
            if self.rebalancer is not None:
                await self.rebalancer.close()
        if leave_on_stop and self.status is not None:
            return 0 if await self.leave() else 1
        return 0


def _note_numerics(view: dict[str, Any]) -> None:
    """A registration that announces (or will announce, pending) other numerics than this
    release's: say how to change it (verifiers on this release's version skip its checks)."""
    try:
        soon = announced_at(view, 1 << 62)  # the version once any pending change took effect
    except NumericsError as error:
        log.warning("numerics of the registration unreadable: %s", error.message)
        return
    if soon is not None and soon != NUMERICS:
        log.warning(
            "the registration announces numerics %d, this release computes with %d: announce "
            "it with `planet node numerics --set` (takes effect at the next epoch)",
            soon,
            NUMERICS,
        )
