"""The watcher's credit-key publisher (node/watcher/credit_keys.py) against an in-process
committee chain: each validator's keys of the current and the next epoch go on chain once,
from its key store, which is what its ABCI app signs mints with; a restart reuses the stored
keys; a committee failure is logged and retried after a backoff, never doubled."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from abci_app.codes import Code
from node.watcher import credit_keys
from node.watcher.credit_keys import CreditKeyPublisher, validator_address
from protocol.committee.credits import CreditKey
from protocol.credit_keys import CreditKeyStore
from protocol.errors import UnavailableError
from tests.committee_chain import Chain
from tests.unit.test_abci_credits import answers, credit_chain, fund, keys_of, mint, send
from tests.unit.test_abci_settlement import ask, next_epoch_end, settled_chain
from tests.unit.test_watcher_payouts import ChainLink

pytestmark = pytest.mark.unit


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class WatchedLink(ChainLink):
    """A validator's `ChainLink` that records its queries and can fail: `down` sends raise
    (nothing sent), `late` sends commit the tx but lose the answer (a timeout)."""

    queries: list[str] = field(default_factory=list)
    down: int = 0
    late: int = 0

    async def query(self, path: str, **params: Any) -> Any:
        self.queries.append(path)
        return await super().query(path, **params)

    async def send(self, body: Any, *, timeout_s: float = 15) -> tuple[int, str]:
        if self.down:
            self.down -= 1
            raise UnavailableError("no committee RPC answers")
        result = await super().send(body, timeout_s=timeout_s)
        if self.late:
            self.late -= 1
            raise UnavailableError("tx not committed within 15 s")
        return result


def publisher(chain: Chain, index: int, store_dir: Path, clock: Clock | None = None) -> Any:
    validator = chain.validators[index]
    return CreditKeyPublisher(
        committee=WatchedLink(chain, index),
        store=CreditKeyStore(store_dir),
        validator=validator_address(validator.pubkey),
        clock=clock or Clock(),
    )


def current_epoch(chain: Chain) -> int:
    return int(ask(chain, "/epochs")["current"])


def on_chain(chain: Chain, epoch: int, index: int) -> bytes | None:
    """Validator `index`'s published key of `epoch` (DER), or None."""
    address = chain.validators[index].address
    keys = [
        k for k in ask(chain, f"/credit_keys?epoch={epoch}")["keys"] if k["validator"] == address
    ]
    return bytes.fromhex(keys[0]["key"]) if keys else None


def long_epochs() -> Chain:
    """A chain that sells credits, with room in an epoch for every publisher's txs."""
    return credit_chain(epoch_length=50)


def test_credit_key_codes_are_the_chains() -> None:
    assert credit_keys.CREDIT_KEY_EPOCH == Code.CREDIT_KEY_EPOCH
    assert credit_keys.DUPLICATE_CREDIT_KEY == Code.DUPLICATE_CREDIT_KEY


async def test_credit_key_publisher_publishes_this_and_the_next_epoch_once(tmp_path: Path) -> None:
    chain = long_epochs()
    epoch = current_epoch(chain)
    keys = publisher(chain, 0, tmp_path / "keys")
    assert await keys.step() == [epoch, epoch + 1]
    store = CreditKeyStore(tmp_path / "keys")
    for e in (epoch, epoch + 1):
        der = on_chain(chain, e, 0)
        assert der is not None and der == store.ensure(e).public.to_der()
    assert on_chain(chain, epoch, 0) != on_chain(chain, epoch + 1, 0)
    assert on_chain(chain, epoch, 1) is None  # only its own validator's
    # nothing due: one /epochs query a pass, no key query, nothing sent
    height = chain.state.height
    keys.committee.queries.clear()
    assert await keys.step() == [] and await keys.step() == []
    assert keys.committee.queries == ["/epochs", "/epochs"]
    assert chain.state.height == height
    # the next epoch: only the epoch after it is new
    next_epoch_end(chain)
    assert current_epoch(chain) == epoch + 1
    assert await keys.step() == [epoch + 2]
    assert on_chain(chain, epoch + 2, 0) == store.ensure(epoch + 2).public.to_der()
    assert len(list((tmp_path / "keys").glob("*.pem"))) == 3


async def test_credit_key_publisher_after_a_restart_publishes_nothing_new(tmp_path: Path) -> None:
    chain = long_epochs()
    epoch = current_epoch(chain)
    await publisher(chain, 0, tmp_path / "keys").step()
    files = sorted((tmp_path / "keys").glob("*.pem"))
    height = chain.state.height
    again = publisher(chain, 0, tmp_path / "keys")  # a restarted watcher, the same home
    assert await again.step() == []
    assert chain.state.height == height  # no tx: no DUPLICATE_CREDIT_KEY
    assert sorted((tmp_path / "keys").glob("*.pem")) == files
    assert again.handled == epoch


async def test_credit_key_publisher_sends_the_key_a_crash_left_unpublished(tmp_path: Path) -> None:
    """A watcher that died between generating and publishing: its successor sends that key."""
    chain = long_epochs()
    epoch = current_epoch(chain)
    stored = CreditKeyStore(tmp_path / "keys").generate(epoch)
    assert await publisher(chain, 0, tmp_path / "keys").step() == [epoch, epoch + 1]
    assert on_chain(chain, epoch, 0) == stored.public.to_der()
    assert len(list((tmp_path / "keys").glob(f"{epoch:012d}-*.pem"))) == 1


async def test_credit_key_publisher_logs_a_committee_error_and_retries_after_a_backoff(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    chain = long_epochs()
    epoch = current_epoch(chain)
    clock = Clock()
    keys = publisher(chain, 0, tmp_path / "keys", clock)
    keys.committee.down = 1
    with caplog.at_level("WARNING", logger="node.watcher.credit_keys"):
        assert await keys.step() == []
    assert "no committee RPC answers" in caplog.text and "retry_in_s=0.5" in caplog.text
    assert on_chain(chain, epoch, 0) is None
    keys.committee.queries.clear()
    assert await keys.step() == [] and keys.committee.queries == []  # backing off: no query
    clock.now += 0.5
    assert await keys.step() == [epoch, epoch + 1]
    assert on_chain(chain, epoch + 1, 0) is not None
    # failures back off longer each time, and a success resets it
    keys.committee.down = 2
    next_epoch_end(chain)
    await keys.step()
    clock.now += 0.5
    await keys.step()
    assert "retry_in_s=1.0" in caplog.text
    clock.now += 1.0
    assert await keys.step() == [epoch + 2]
    assert keys.retry_at == 0.0


async def test_credit_key_publisher_after_a_lost_answer_sends_no_duplicate(
    tmp_path: Path,
) -> None:
    """The tx landed but its answer timed out: the retry finds the key on chain, sends none."""
    chain = long_epochs()
    epoch = current_epoch(chain)
    clock = Clock()
    keys = publisher(chain, 0, tmp_path / "keys", clock)
    keys.committee.late = 1
    assert await keys.step() == []
    assert on_chain(chain, epoch, 0) is not None and on_chain(chain, epoch + 1, 0) is None
    height = chain.state.height
    clock.now += 0.5
    assert await keys.step() == [epoch + 1]
    assert chain.state.height == height + 1  # one tx: the key of epoch + 1 only


async def test_credit_key_publisher_a_duplicate_refusal_counts_as_published(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A key that lands after the chain was read (a late send): DUPLICATE is not a failure."""
    chain = long_epochs()
    epoch = current_epoch(chain)
    keys = publisher(chain, 0, tmp_path / "keys")
    late = CreditKeyStore(tmp_path / "keys").ensure(epoch)
    real_query = keys.committee.query

    async def query(path: str, **params: Any) -> Any:
        answer = await real_query(path, **params)
        if path == "/credit_keys" and params["epoch"] == epoch:
            tx = chain.tx(CreditKey(epoch, late.public.to_der()), chain.validators[0].key)
            assert [r.code for r in chain.block([tx])] == [Code.OK]
        return answer

    keys.committee.query = query
    with caplog.at_level("WARNING", logger="node.watcher.credit_keys"):
        assert await keys.step() == [epoch + 1]
    assert f"credit key of epoch {epoch} was on chain already" in caplog.text
    assert keys.retry_at == 0.0 and keys.handled == epoch
    assert on_chain(chain, epoch, 0) == late.public.to_der()


async def test_credit_key_publisher_logs_a_key_on_chain_it_cannot_sign_with(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    chain = long_epochs()
    epoch = current_epoch(chain)
    await publisher(chain, 0, tmp_path / "elsewhere").step()  # another key directory
    with caplog.at_level("ERROR", logger="node.watcher.credit_keys"):
        assert await publisher(chain, 0, tmp_path / "keys").step() == []
    assert f"credit key of epoch {epoch} on chain" in caplog.text
    assert "cannot sign" in caplog.text


async def test_credit_key_publisher_without_genesis_credits_publishes_nothing(
    tmp_path: Path,
) -> None:
    chain = settled_chain(credits=None, epoch_length=50)
    keys = publisher(chain, 0, tmp_path / "keys")
    assert await keys.step() == [] and await keys.step() == []
    assert keys.committee.queries == ["/params"]  # read once
    assert on_chain(chain, current_epoch(chain), 0) is None
    assert not (tmp_path / "keys").exists()


async def test_credit_keys_published_by_the_watchers_sign_a_mint(tmp_path: Path) -> None:
    """Every validator's publisher publishes from its own store; each ABCI app answers
    `/credit_signatures` from that store, and the client finalizes valid credits."""
    chain = long_epochs()
    epoch = current_epoch(chain)
    dirs = [tmp_path / f"v{i}" / "credit_keys" for i in range(len(chain.validators))]
    for index, directory in enumerate(dirs):
        assert await publisher(chain, index, directory).step() == [epoch, epoch + 1]
    assert current_epoch(chain) == epoch
    keys = keys_of(chain, epoch)
    assert len(keys.keys) == len(chain.validators)
    request = mint(chain, keys, 2)
    result = send(chain, request.body, chain.validators[0].key)
    assert result.code == Code.OK, result.log
    fund(chain, request.mint_id)
    apps = [CreditKeyStore(d) for d in dirs]  # what each validator's app reads
    credits = request.finalize(keys, answers(chain, apps, request.mint_id))
    assert len(credits) == 2 and all(len(c.signatures) == len(dirs) for c in credits)
