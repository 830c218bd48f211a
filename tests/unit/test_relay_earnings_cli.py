"""`planet earnings` for a relay's operator (node/cli/relay_earnings.py; issue 43): against the
in-process committee chain (tests/committee_chain.py) standing in for the validators' RPC, and
an escrow fake where the root is posted. Before the close it shows what the relay redeemed so
far this epoch and what that pays (not "0 layer-tokens"); after it, the epoch's row for the
relay's staking address beside the credits redeemed in that epoch; a node's home or a home
without a committee key has no relay part; answers of another shape are refused by name."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from abci_app.codes import Code
from abci_app.queries import query
from node.cli.relay_earnings import RelayAnswerInvalid, parse_price, parse_relay_credits
from node.keys import NODE_KEY_FORMAT
from planet.main import main
from protocol.committee.relay_credits import RelayRedeem
from protocol.eip712 import address_of
from protocol.errors import RemoteError
from tests.committee_chain import Chain, seeded_evm_key
from tests.credit_chain import PRICE, minted, node_chain, send
from tests.unit.test_abci_relay_payouts import close, fresh_epoch
from tests.unit.test_abci_relays import add_relay

pytestmark = pytest.mark.unit

NOW = 1_000
LABEL = "earnings-relay"
KEY = "ab" * 32


class _Escrow:
    """QueryEscrow as `planet earnings` reads it: every root posted, claimable, unclaimed."""

    def __init__(self, config: object) -> None:
        pass

    def epoch_of(self, epoch: int) -> tuple[int, int]:
        return 1, NOW - 1

    def payable(self, epoch: int, amount: int) -> int:
        return amount

    def claimed(self, epoch: int, account: str) -> bool:
        return False

    def now(self) -> int:
        return NOW


@pytest.fixture
def chain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Chain:
    """A credit chain whose queries every `CommitteeLink` of the CLI is answered from."""
    import node.chain.committee_link
    import node.cli.earnings

    chain, _ = node_chain(tmp_path)

    class Link:
        def __init__(self, urls: object, key: object = None) -> None:
            pass

        async def query(self, path: str, **params: Any) -> Any:
            full = path + ("?" + urlencode(params) if params else "")
            code, value, log = query(chain.state, full, b"")
            if code != Code.OK:
                raise RemoteError("committee", f"query_{int(code)}", log)
            return json.loads(value)

        async def close(self) -> None:
            return None

    monkeypatch.setattr(node.chain.committee_link, "CommitteeLink", Link)
    monkeypatch.setattr(node.cli.earnings, "EscrowView", _Escrow)
    monkeypatch.delenv("PLANET_DEVNET", raising=False)
    monkeypatch.setenv("PLANET_HOME", str(tmp_path / "planet-home"))
    return chain


def home_of(tmp_path: Path, label: str, committee_key: str | None) -> Path:
    """An operator home: the staking wallet of `label` (its address is all `earnings` reads)
    and, when given, the public half of its committee key."""
    home = tmp_path / label
    home.mkdir()
    address = address_of(seeded_evm_key(label))
    (home / "wallet.json").write_text(json.dumps({"address": address[2:].lower()}))
    if committee_key is not None:
        record = {"format": NODE_KEY_FORMAT, "public_key": committee_key}
        (home / "node_key.json").write_text(json.dumps(record))
    return home


def earnings(home: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    argv = ["earnings", "--home", str(home), "--committee-rpc", "http://committee.invalid"]
    assert main([*argv, *extra]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_a_relay_sees_its_redemptions_before_the_close_and_its_row_after(
    chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    relay = add_relay(chain, LABEL)
    key = relay.verify_key.encode().hex()
    home = home_of(tmp_path, LABEL, key)
    credits, _ = minted(chain, tmp_path, count=3)
    epoch = fresh_epoch(chain)
    assert send(chain, RelayRedeem(tuple(credits)), relay).code == Code.OK
    account = address_of(seeded_evm_key(LABEL)).lower()

    # before the close: what the relay redeemed so far this epoch, and what it will pay
    doc = json.loads(earnings(home, capsys, "--json"))
    assert doc["current_epoch"] == {"epoch": epoch, "layer_tokens": 0}  # no node work
    assert doc["relay"] == {
        "key": key,
        "account": account,
        "status": "JOIN",
        "price_wei": str(PRICE),
        "current_epoch": {"epoch": epoch, "credits": 3, "due": str(3 * PRICE)},
        "epochs": [],
    }
    assert doc["epochs"] == [] and doc["pending"] == "0"
    text = earnings(home, capsys)
    assert f"this epoch  {epoch}: 3 credits redeemed by the relay so far: 0.000003 ETH" in text
    assert "layer-tokens" not in text  # a relay has none: not "0 … credited so far"

    # after the close: its row on the pool page, beside the credits it redeemed then
    payout = close(chain, epoch)
    assert [account, str(3 * PRICE)] in payout["rows"]
    doc = json.loads(earnings(home, capsys, "--json"))
    assert doc["relay"]["epochs"] == [
        {"epoch": epoch, "credits": 3, "due": str(3 * PRICE), "paid": str(3 * PRICE)}
    ]
    assert doc["relay"]["current_epoch"]["credits"] == 0
    [row] = doc["epochs"]
    assert (row["epoch"], row["amount"], row["state"]) == (epoch, str(3 * PRICE), "claimable")
    assert doc["claimable"] == str(3 * PRICE)
    text = earnings(home, capsys)
    assert f"epoch {epoch:<5} {'0.000003 ETH':>24}  credits 3 " in text
    # one epoch asked for: its statement and the relay's credits of that epoch only
    doc = json.loads(earnings(home, capsys, "--json", "--epoch", str(epoch)))
    assert [e["epoch"] for e in doc["relay"]["epochs"]] == [epoch]


def test_an_unpaid_closed_epoch_is_said(
    chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Credits redeemed in an epoch whose close wrote no row for the relay (here: the relay's
    address slashed in it, so the close pays it nothing) are listed as unpaid, not hidden."""
    from abci_app import schema

    relay = add_relay(chain, LABEL)
    home = home_of(tmp_path, LABEL, relay.verify_key.encode().hex())
    credits, _ = minted(chain, tmp_path, count=2)
    epoch = fresh_epoch(chain)
    assert send(chain, RelayRedeem(tuple(credits)), relay).code == Code.OK
    account = address_of(seeded_evm_key(LABEL)).lower()
    # the epoch's last block, with a verdict against the relay's address confirmed in it
    length = chain.state.genesis.epoch_length
    chain.advance_to(epoch * length - 1)
    machine, height = chain.machine, epoch * length
    vx = chain.extended_commit(height - 1) if machine.vx_required(height) else None
    proposal = machine.prepare_proposal(height, [], 1 << 22, vx)
    machine.begin_block(height, hashlib.sha256(b"slashing block").digest(), chain.time_s)
    chain.state.put(schema.SLASHED, schema.in_epoch(epoch, account), ["failed_verification"])
    for i, raw in enumerate(proposal):
        machine.deliver_tx(raw, i)
    machine.end_block()
    machine.commit()
    doc = json.loads(earnings(home, capsys, "--json"))
    assert doc["relay"]["epochs"] == [
        {"epoch": epoch, "credits": 2, "due": str(2 * PRICE), "paid": "0"}
    ]
    assert f"epoch {epoch:<5} 2 credits redeemed: no row at its close" in earnings(home, capsys)


def test_a_node_home_or_a_home_without_a_committee_key_has_no_relay_part(
    chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node_key = "credit-node"  # node_chain's node: its key is a compute node's
    from tests.committee_chain import seeded_key

    node_home = home_of(tmp_path, node_key, seeded_key(node_key).verify_key.encode().hex())
    doc = json.loads(earnings(node_home, capsys, "--json"))
    assert "relay" not in doc
    text = earnings(node_home, capsys)
    assert "layer-tokens credited so far" in text and "relay" not in text
    bare = home_of(tmp_path, "no-committee-key", None)
    assert "relay" not in json.loads(earnings(bare, capsys, "--json"))
    stranger = home_of(tmp_path, "never-registered", KEY)  # a key the committee never saw
    assert "relay" not in json.loads(earnings(stranger, capsys, "--json"))


def test_claim_with_nothing_due_tells_a_relay_to_keep_relaying_and_a_node_to_serve(
    chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`planet claim` with no epoch at all: the hint says how this home earns (a relay does not
    serve questions)."""
    from tests.committee_chain import seeded_key

    relay = add_relay(chain, LABEL)
    homes = {
        "relay": home_of(tmp_path, LABEL, relay.verify_key.encode().hex()),
        "node": home_of(
            tmp_path, "credit-node", seeded_key("credit-node").verify_key.encode().hex()
        ),
    }
    for kind, home in homes.items():
        argv = ["claim", "--home", str(home), "--committee-rpc", "http://committee.invalid"]
        assert main(argv) != 0
        err = capsys.readouterr().err
        assert "nothing to claim" in err, err
        if kind == "relay":
            assert "planet relay serve" in err and "serve questions" not in err, err
        else:
            assert "serve questions" in err and "relay" not in err, err


@pytest.mark.parametrize(
    ("answer", "text"),
    [
        ([], "expected the record"),
        ({"key": "cd" * 32, "epochs": []}, "expected the record"),
        ({"key": KEY, "epochs": {}}, "not a list"),
        ({"key": KEY, "epochs": [1]}, "not an object"),
        ({"key": KEY, "epochs": [{"epoch": 0, "credits": 1}]}, "epoch"),
        ({"key": KEY, "epochs": [{"epoch": 2, "credits": -1}]}, "credits"),
        ({"key": KEY, "epochs": [{"epoch": 2, "credits": True}]}, "credits"),
        ({"key": KEY, "epochs": [{"epoch": 2, "credits": 1}] * 2}, "listed twice"),
        ({"key": KEY, "epochs": [], "evm_address": "0x12"}, "not an EVM address"),
    ],
)
def test_a_relay_credits_answer_of_another_shape_is_refused_by_name(answer: Any, text: str) -> None:
    with pytest.raises(RelayAnswerInvalid) as refused:
        parse_relay_credits(answer, KEY)
    assert refused.value.code == "relay_answer_invalid" and text in refused.value.message


def test_the_credit_price_is_read_from_genesis() -> None:
    assert parse_price({"genesis": {"credits": {"price_wei": "1000"}}}) == 1000
    assert parse_price({"genesis": {}}) == 0  # a chain that sells no credits pays relays nothing
    for bad in ({}, {"genesis": {"credits": {"price_wei": 5}}}, {"genesis": {"credits": 1}}):
        with pytest.raises(RelayAnswerInvalid):
            parse_price(bad)
