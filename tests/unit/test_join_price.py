"""What `planet join` charges (node/cli/join_price.py) and how the agent registers it on the
chain (node/agent/pricing.py): paid at the pool's going price unless told otherwise, free only
when asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node.agent.pricing import PriceKeeper, registered_price
from node.cli.join_price import going_from_rows, join_price
from protocol.committee.prices import DEFAULT_PRICE_POSITIONS, SetPrice
from protocol.errors import UsageError

pytestmark = pytest.mark.unit

NODE = "ab" * 32


def test_join_charges_the_going_price_unless_told_and_is_free_only_when_asked() -> None:
    asked: list[int] = []

    def going() -> int:
        asked.append(1)
        return 48

    assert join_price(None, False, going) == 48 and asked == [1]  # no flag: paid
    assert join_price(32, False, going) == 32
    assert join_price(0, False, going) == 0  # `--credit-positions 0`: free, as asked
    assert join_price(None, True, going) == 0 and join_price(0, True, going) == 0
    assert asked == [1]  # the chain is asked only when no flag says the price
    with pytest.raises(UsageError, match="--free and --credit-positions 8 disagree"):
        join_price(8, True, going)
    with pytest.raises(UsageError, match="must be 0 \\(free\\) or a positive count"):
        join_price(-1, False, going)


def test_the_going_price_is_the_median_of_every_row_or_the_default() -> None:
    rows = [{"positions": p} for p in (128, 0, 16, None, 64, 96)]
    assert going_from_rows(rows) == 64  # 16 64 96 128: the lower middle
    for odd in ([], [{}], [{"positions": 0}], [{"positions": "64"}], [{"positions": 2**40}]):
        assert going_from_rows(odd) == DEFAULT_PRICE_POSITIONS


def test_join_help_says_what_the_price_means(capsys: pytest.CaptureFixture[str]) -> None:
    from planet import main as cli

    with pytest.raises(SystemExit):
        cli.main(["join", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "one bearer credit buys N positions" in text
    assert "Default: the pool's going price" in text and "--free" in text


class FakeLink:
    signer = NODE

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.sent: list[Any] = []

    async def query(self, path: str, **params: Any) -> Any:
        assert path == "/prices" and params == {"model": "m", "node": NODE}
        return {"prices": self.rows, "going_price": 64}

    async def submit(self, body: Any) -> Any:
        self.sent.append(body)
        return None


async def test_the_agent_registers_its_price_once_the_chain_lacks_it() -> None:
    link = FakeLink()
    keeper = PriceKeeper(link, "m", 2, 64)
    await keeper.step()
    assert link.sent == [SetPrice("m", 2, 64)] and not keeper.settled
    for _ in range(5):  # looked at again a few passes later, not sent twice meanwhile
        await keeper.step()
    assert len(link.sent) == 1
    link.rows = [{"node": NODE, "shard": 2, "positions": 32, "next": {"epoch": 9, "positions": 64}}]
    await keeper.step()  # the change waits for the next epoch: registered all the same
    assert keeper.settled and len(link.sent) == 1
    assert registered_price({"prices": link.rows}, NODE, 2) == 64
    assert registered_price({"prices": link.rows}, NODE, 1) is None
    assert registered_price("odd", NODE, 2) is None


async def test_a_node_raising_its_price_mid_epoch_charges_the_registered_one(
    tmp_path: Path,
) -> None:
    """node/server/chain_price.py: the compute process charges the price on the chain for the
    current epoch, whatever its own flag now says; the raise counts from the next epoch."""
    from types import SimpleNamespace

    from node.server.chain_price import refresh
    from tests.credit_chain import node_chain
    from tests.unit.test_abci_settlement import next_epoch_end
    from tests.unit.test_abci_state import hexkey
    from tests.unit.test_credit_till import ChainLink

    chain, node = node_chain(tmp_path, price=None, heartbeat_timeout=10_000, epoch_length=20)
    link = ChainLink(chain, node)
    length = chain.state.genesis.epoch_length
    if chain.state.height % length > length - 4:
        next_epoch_end(chain)
    await link.submit(SetPrice("m", 0, 64))
    await link.submit(SetPrice("m", 0, 16))  # restarted with a raise: a credit per 16 positions
    state = SimpleNamespace(payments=SimpleNamespace(positions=16))  # what its flag says
    await refresh(state, link, hexkey(node), "m", 0)
    assert state.payments.positions == 64  # its clients pay a credit per 64 this epoch
    next_epoch_end(chain)
    await refresh(state, link, hexkey(node), "m", 0)
    assert state.payments.positions == 16
