"""The session's shared devnet (tests/e2e/conftest.py), driven only through the CLI and RPC.

Real processes throughout: anvil, 4 CometBFT validators with their ABCI apps and stake
watchers, 3 compute nodes staked and joined by `planet stake` / `planet join`, each with its
agent. Checks: everything is alive and listed; served questions are settled, posted and
claimed; a relay's redeemed credits are a posted row its operator claims; a prepaid question is
debited once; an unstaked node stops being routable; a node
whose stake was never attested is never routable; a new operator home with no config funds
(`planet devnet fund`), stakes, joins and leaves (dropping out of the routable set) through
commands that find the devnet by themselves; a node convicted by its numerics version's quorum
(half the power, short of FraudProofs' 2/3) is ratified by the other validators' watchers and
slashed on anvil. Each test pays from a wallet of its own and
stakes, unstakes or leaves only with operators of its own, so the genesis nodes keep serving
every module that shares the devnet. `planet devnet down` at the end of the session stops
every process (and is idempotent): the conftest's teardown checks it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from node.procs import Child, spawn_piped, terminate
from node.server.launcher import pid_alive
from protocol.committee.prices import going_price
from tests.bench_runs import one_benchmark_object, run_bench
from tests.e2e.devnet_session import (
    QUESTIONS,
    User,
    operator_env,
    pids_alive,
    release_operator,
)
from tests.e2e.devnet_session import nodes as _nodes
from tests.e2e.devnet_session import planet as _planet
from tests.e2e.devnet_session import query as _query
from tests.e2e.devnet_session import wait as _wait
from tests.e2e.escrow_reads import escrow_contract

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# the operators of model 1, the second model's seat (deploy/devnet/second_model.py), the user
GENESIS_ACCOUNTS = ["node0", "node1", "node2", "seat0", "user"]


@pytest.fixture(scope="module")
def env(devnet_env: dict[str, str]) -> dict[str, str]:
    return devnet_env


@pytest.fixture(scope="module")
def devnet(shared_devnet: dict[str, Any]) -> dict[str, Any]:
    return shared_devnet


def _status(env: dict[str, str]) -> dict[str, Any]:
    done = _planet(env, "devnet", "status", "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _view(devnet: dict[str, Any], key: str) -> dict[str, Any] | None:
    return _query(devnet["committee_rpc"][0], "/node", key=key)


SETTLED_TEST = "test_devnet_served_questions_are_settled_signed_posted_and_claimed"
# scenario → (its test, what runs its first half: up to the epoch's root posted)
HEAD_STARTS: dict[str, tuple[str, Callable[..., Any]]] = {
    "relay": ("test_devnet_relay_redeems_credits_and_claims_its_row", lambda: _relay_start),
    "voucher": (
        "test_devnet_voucher_question_is_debited_in_a_posted_root_claimed_and_replay_refused",
        lambda: _voucher_start,
    ),
    "gateway2": (
        "test_devnet_a_second_gateway_binds_itself_is_paid_its_users_fees_and_not_the_firsts",
        lambda: _gateway2_start,
    ),
}


class _HeadStarts:
    """The first halves of the scenarios that wait for an epoch's root to be posted, each with
    users, operators and processes of its own, run side by side in the background while the
    tests before theirs run (issue 41: a devnet's every second of waiting costs CPU); each test
    takes its own result (`head_starts[name].result()`, its failure raised there) and goes on
    in the foreground with what moves anvil's clock (the claims). Only the collected tests'
    scenarios run; one asked for before it began begins then."""

    def __init__(self, env: dict[str, str], devnet: dict[str, Any], folder: Path,
                 tests: set[str]) -> None:  # fmt: skip
        self.env, self.devnet, self.folder, self.tests = env, devnet, folder, tests
        self.pool = ThreadPoolExecutor(max_workers=len(HEAD_STARTS))
        self.futures: dict[str, Future[Any]] = {}

    def begin(self, name: str) -> None:
        test, first_half = HEAD_STARTS[name]
        if name in self.futures or test not in self.tests:
            return
        if name != "relay" and not self.devnet.get("gateway_url"):
            return  # their tests skip
        folder = self.folder / name
        folder.mkdir()
        self.futures[name] = self.pool.submit(first_half(), self.env, self.devnet, folder)

    def __getitem__(self, name: str) -> Future[Any]:
        self.begin(name)
        return self.futures[name]

    def close(self) -> None:
        """Wait for every first half and stop what a test did not take (its processes)."""
        for future in self.futures.values():
            try:
                started = future.result()
            except BaseException:  # raised in its test already (or that test never ran)
                continue
            if hasattr(started, "close"):
                started.close()
        self.pool.shutdown(wait=True)


@pytest.fixture(scope="module", autouse=True)
def head_starts(
    request: pytest.FixtureRequest, env: dict[str, str], devnet: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[_HeadStarts]:  # fmt: skip
    """The relay's and the second gateway's first halves begin with the module's first test;
    the voucher's after the settled test's claims (that test claims every page of the first
    gateway's, the voucher's page too once it is posted), at once when that test is not run."""
    tests = {getattr(item, "originalname", item.name) for item in request.session.items}
    starts = _HeadStarts(env, devnet, tmp_path_factory.mktemp("head-starts"), tests)
    try:
        starts.begin("relay")
        starts.begin("gateway2")
        if SETTLED_TEST not in tests:
            starts.begin("voucher")
        yield starts
    finally:
        starts.close()


@pytest.fixture(autouse=True)
def _voucher_after_the_settled_test(
    request: pytest.FixtureRequest, head_starts: _HeadStarts
) -> Iterator[None]:
    yield
    if getattr(request.node, "originalname", request.node.name) == SETTLED_TEST:
        head_starts.begin("voucher")


def test_devnet_status_lists_validators_routable_nodes_pool_and_contracts(env, devnet) -> None:
    status = _status(env)
    assert status["status"] == "up" and status["running"]
    assert status["processes"]["anvil"]
    validators = status["validators"]
    assert len(validators) == 4
    for row in validators:
        assert row["app_alive"] and row["cometbft_alive"] and row["watcher_alive"], row
        assert row["height"] and row["height"] > 0
    routable = [n for n in status["nodes"] if n["routable"]]
    assert len(routable) == 3
    assert sorted(s for n in routable for s in n["shards"]) == [0, 1, 2]
    assert all(n["stake"] == str(10**18) and n["status"] == "SERVING" for n in routable)
    assert status["pool"]["status"] in ("healthy", "degraded")
    assert status["pool"]["routable_per_shard"] == [1, 1, 1]
    for name in ("Committee", "Staking", "FraudProofs", "QueryEscrow", "ModelRegistry"):
        assert status["contracts"][name].startswith("0x")
    for local in status["local_nodes"]:
        assert local["node_alive"] and local["agent_alive"]
    # the genesis accounts, then any the session's tests funded (`planet devnet fund`)
    names = [a["name"] for a in status["accounts"]]
    genesis = len(GENESIS_ACCOUNTS)
    assert names[:genesis] == GENESIS_ACCOUNTS and set(names[genesis:]) <= {"funded"}
    for account in status["accounts"][:genesis]:
        assert Path(account["keystore"]).is_file()


def test_devnet_committee_contract_has_the_genesis_operators(env, devnet) -> None:
    params = _query(devnet["committee_rpc"][0], "/params")
    operators = sorted(v["operator"].lower() for v in params["validators"])
    from web3 import Web3

    deployment = json.loads(Path(devnet["deployment"]).read_text())
    committee = deployment["contracts"]["Committee"]
    w3 = Web3(Web3.HTTPProvider(devnet["evm_rpc"]))
    contract = w3.eth.contract(address=committee["address"], abi=committee["abi"])
    members = sorted(m.lower() for m in contract.functions.members().call())
    assert members == operators
    assert params["genesis"]["evm"]["committee_address"].lower() == committee["address"].lower()


CHALLENGE_WINDOW_S = 60  # DeployConfig.devnet's QueryEscrow window


def _paid(devnet: dict[str, Any], accounts: list[str]) -> dict[str, dict[int, int]] | None:
    """{account: {epoch: amount}} over the epochs posted on the escrow, once every account has
    some; None before (also when a busy RPC did not answer in time: asked again). Epochs not
    posted yet are left out, not waited for: on the shared devnet a newer epoch is pending
    most of the time."""
    try:
        return _paid_now(devnet, accounts)
    except (OSError, ValueError) as error:  # urllib/requests timeouts are OSErrors
        print(f"_paid: {error!r}", file=sys.stderr)
        return None


def _paid_now(devnet: dict[str, Any], accounts: list[str]) -> dict[str, dict[int, int]] | None:
    _, escrow = escrow_contract(devnet)
    listing = _query(devnet["committee_rpc"][0], "/payouts") or {"epochs": []}
    paid: dict[str, dict[int, int]] = {a.lower(): {} for a in accounts}
    for summary in listing["epochs"]:
        epoch = summary["epoch"]
        if escrow.functions.epochOf(epoch).call()[3] != 1:  # not posted (yet)
            continue
        view = _query(devnet["committee_rpc"][0], "/payouts", epoch=str(epoch))
        for account, amount in view["rows"]:
            if account in paid:
                paid[account][epoch] = int(amount)
    return paid if all(paid.values()) else None


def _signed(node: int, devnet: dict[str, Any], body: Any) -> tuple[int, str]:
    """Send `body` signed with operator node<i>'s node key; (FinalizeBlock code, log). The
    node's agent signs with the same key (heartbeats, commitments, redemptions) and under load
    took the nonce of all three of `CommitteeLink.send`'s tries in one CI-like run: it is
    paused (SIGSTOP) while the test's tx is sent, then resumed."""
    from node.keys import load_node_key

    password = Path(devnet["password_file"]).read_text()
    home = Path(devnet["operators"][node])
    agent = int(json.loads((home / "run" / "joined.json").read_text())["agent_pid"])
    os.kill(agent, signal.SIGSTOP)
    try:
        return _send_signed(load_node_key(home / "node_key.json", password), devnet, body)
    finally:
        os.kill(agent, signal.SIGCONT)


def _send_signed(key: Any, devnet: dict[str, Any], body: Any) -> tuple[int, str]:
    """Send `body` signed with `key`; (code, log) of FinalizeBlock, or of CheckTx if refused.

    The key's own process (a node's agent, the gateway's reporter) signs too: a tx of ours can
    take the nonce its pending tx also took, then lose (BAD_NONCE in the block) or leave the
    mempool and never be committed. `CommitteeLink.send` signs it again as soon as the
    signer's committed nonce has passed it (waiting for a block that never comes cost this
    test 4 × 30 s in loaded runs)."""
    import asyncio

    from node.chain.committee_link import CommitteeLink
    from node.chain.committee_rpc import TxRejectedError

    async def send() -> tuple[int, str]:
        link = CommitteeLink(devnet["committee_rpc"], key)
        try:
            return await link.send(body, timeout_s=30)
        except TxRejectedError as error:  # refused at CheckTx already
            return error.tx_code, error.log_text
        finally:
            await link.close()

    return asyncio.run(send())


def _gateway_account(devnet: dict[str, Any]) -> tuple[str, str]:
    """(the gateway's home, its wallet's address): its revenue's payee."""
    from node.keys import wallet_address

    home = Path(devnet["dir"]) / "gateway"
    return str(home), wallet_address(home / "wallet.json").lower()


def test_devnet_served_questions_are_settled_signed_posted_and_claimed(
    env, devnet, fresh_user
) -> None:
    """questions answered, paid to the gateway by deposit → the gateway pays the charging nodes
    with its credits, the nodes redeem them → the epoch closes: the credit pool's draw paid to
    the nodes on the pool's page, the fees to the gateway on its own → the roots are posted
    with ≥ 2/3 operator signatures → each node, and the gateway, claims exactly its amount;
    a node's own work report, a double claim and a forged or under-signed root are refused."""
    if not devnet.get("gateway_url"):
        pytest.skip("this checkout has no gateway")
    from node.chain.evm.account import PlanetChain
    from node.chain.evm.deployment import Deployment
    from node.chain.evm.errors import ContractRevert
    from node.keys import load_wallet
    from protocol.committee.settlement import WorkReport
    from protocol.eip712 import PayoutRoot, committee_domain, committee_signatures, queries_hash

    operators = [a for a in devnet["accounts"] if a["name"].startswith("node")]
    gateway_home, gateway = _gateway_account(devnet)
    addresses = [a["address"] for a in operators] + [gateway]
    paid = None
    for question in ("What is two plus two?", "Name a colour.", "Say hello."):
        asked = _planet(env, "ask", "--pay", *fresh_user.pay_args(), "--max-tokens", "6",
                        question, timeout=300)  # fmt: skip
        assert asked.returncode == 0, asked.stderr[-3000:]
        try:
            paid = _wait(
                lambda: _paid(devnet, addresses), 90, "every node and the gateway paid in roots"
            )
            break
        except AssertionError:
            continue  # a redemption or report landed after its epoch closed: the next one
    assert paid is not None, "no epoch roots paid all three nodes and the gateway"
    rpc = devnet["committee_rpc"][0]
    escrow_address = devnet["contracts"]["QueryEscrow"].lower()
    for account, per in paid.items():
        for epoch in per:
            view = _query(rpc, "/payouts", epoch=str(epoch))
            assert view["confirmed"] and 3 * view["power"] >= 2 * 4  # 4 validators, power 1 each
            assert int(view["total"]) == sum(int(a) for _, a in view["rows"]) > 0
            if account == gateway:  # its own page: its users' fees or charges, one row (the
                # shared devnet's other tests pay the gateway by voucher too: charges, no ids)
                assert view["rows"] == [[gateway, view["total"]]]
                assert view["query_ids"] or view["debits"] or view["charges"], view
            else:  # the pool's page: the draw on the credit pool, paid per redemption
                assert view["query_ids"] == [] and [escrow_address] * 2 in [
                    [p.lower(), g.lower()]
                    for p, g in zip(view["payers"], view["gateways"], strict=True)
                ]

    # a node cannot report fees for itself: only keys bound by a gateway tx report
    forged = WorkReport((("0x" + "5e" * 32, 5),))
    code, log = _signed(0, devnet, forged)
    assert code == 30, log  # UNKNOWN_GATEWAY

    # claims open after the escrow's window: move anvil's clock past it
    w3, escrow = escrow_contract(devnet)
    w3.provider.make_request("evm_increaseTime", [CHALLENGE_WINDOW_S + 1])
    w3.provider.make_request("evm_mine", [])
    password = Path(devnet["password_file"]).read_text()
    homes = [{"home": gateway_home, "address": gateway}, *operators]
    for operator in homes:
        home = operator["home"]
        claimed = _planet(env, "claim", "--home", home, "--password-file",
                          devnet["password_file"], timeout=120)  # fmt: skip
        assert claimed.returncode == 0, claimed.stderr[-2000:]
        # what each claim tx paid the account: its balance across the tx's own block, plus the
        # tx's fee (anvil mines one tx a block; on the shared devnet the gateway's wallet also
        # buys credits meanwhile, so the balance before and after the command is no measure)
        account = w3.to_checksum_address(operator["address"])
        received = 0
        epochs = []  # "claimed <eth> for epoch <E> (tx <hash>)"
        for line in claimed.stdout.splitlines():
            epochs.append(int(line.split(" for epoch ", 1)[1].split(" ", 1)[0]))
            tx = line.rsplit("(tx ", 1)[1].rstrip(")")
            receipt = w3.eth.get_transaction_receipt(tx)
            block = receipt["blockNumber"]
            assert w3.eth.get_block(block)["transactions"] == [receipt["transactionHash"]]
            fee = receipt["gasUsed"] * receipt["effectiveGasPrice"]
            delta = w3.eth.get_balance(account, block) - w3.eth.get_balance(account, block - 1)
            received += delta + fee
        # every epoch found paid above, and any posted since, each for exactly its row, scaled
        # by what the epoch collected when a payer was short at posting (the shortfall rule;
        # the dApp's tests on the shared devnet leave such payers)
        assert set(paid[operator["address"].lower()]) <= set(epochs)
        expected = payable = 0
        for e in epochs:
            proof = _query(rpc, "/payouts/proof", epoch=str(e), account=operator["address"])
            total, collected = escrow.functions.shortfallOf(e).call()
            expected += int(proof["amount"])
            payable += int(proof["amount"]) * collected // total if total else int(proof["amount"])
        assert received == payable
        # the CLI's view after claiming, for one operator (each `planet` start costs seconds)
        if operator is operators[0]:
            earnings = _planet(env, "earnings", "--home", home, "--json", timeout=60)
            assert earnings.returncode == 0, earnings.stderr
            # the CLI counts what the escrow paid, not the signed row (`expected`), on short epochs
            assert json.loads(earnings.stdout)["claimed"] == str(payable), (expected, payable)
            again = _planet(env, "claim", "--home", home, "--password-file",
                            devnet["password_file"], timeout=60)  # fmt: skip
            assert again.returncode == 2 and "nothing to claim" in again.stderr
        # the escrow itself reverts a second claim
        wallet = load_wallet(Path(home) / "wallet.json", password)
        chain = PlanetChain(Deployment.load(devnet["deployment"]), bytes(wallet.key))
        epoch = min(paid[operator["address"].lower()])
        proof = _query(rpc, "/payouts/proof", epoch=str(epoch), account=operator["address"])
        with pytest.raises(ContractRevert) as double:
            chain.escrow.claim(
                epoch, int(proof["amount"]), [bytes.fromhex(p[2:]) for p in proof["proof"]]
            )
        assert double.value.error_name == "AlreadyClaimed"

    # a root for an epoch the committee never closed: forged or under-signed, refused
    deployment = Deployment.load(devnet["deployment"])
    user = load_wallet(Path(devnet["dir"]) / "user" / "wallet.json", password)
    relayer = PlanetChain(deployment, bytes(user.key))
    statement = PayoutRoot(
        epoch=10**6,
        root=b"\x11" * 32,
        total=0,
        queries_hash=queries_hash([], []),
        consumer=deployment.address("QueryEscrow"),
    )
    domain = committee_domain(deployment.chain_id, deployment.address("Committee"))
    strangers = [bytes([i]) * 32 for i in (7, 8, 9)]
    from node.keys import read_operator_key

    committee_dir = Path(devnet["committee_dir"])
    real = [read_operator_key(committee_dir / f"node{i}" / "config" / "operator_key.json")
            for i in range(2)]  # fmt: skip
    for keys, reason in ((strangers, "UnknownSigner"), (real, "InsufficientPower")):
        sigs = committee_signatures(statement, keys, domain)
        with pytest.raises(ContractRevert) as refused:
            relayer.escrow.post_payout_root(statement, [], [], sigs)
        assert refused.value.error_name == reason
    assert escrow.functions.epochOf(10**6).call()[3] == 0


RELAY_CREDITS = 2  # credits the test's paying user gives the relay


def _redeemed(rpc: str, key: str) -> dict[int, int] | None:
    """{epoch: credits} the relay of committee `key` redeemed, once it is all of them."""
    try:
        answer = _query(rpc, "/relay_credits", key=key)
    except (OSError, ValueError) as error:  # a busy RPC: asked again
        print(f"_redeemed: {error!r}", file=sys.stderr)
        return None
    per = {int(e["epoch"]): int(e["credits"]) for e in (answer or {}).get("epochs", [])}
    return per if sum(per.values()) == RELAY_CREDITS else None


@dataclass
class _RelayStart:
    """The relay scenario's first half (`_relay_start`): its operator's home and account, the
    running `planet relay serve`, and the epoch its credits were redeemed in and posted."""

    home: Path
    own_env: dict[str, str]
    relay_account: str
    relay: Child
    log: IO[str]
    epoch: int = 0  # the epoch the relay redeemed its credits in
    paid: dict[str, dict[int, int]] = field(default_factory=dict)  # _paid's answer
    closed: bool = False

    def close(self) -> None:
        """Stop the relay, and take it off the committee for good once it registered (once)."""
        if self.closed:
            return
        self.closed = True
        relay = self.relay
        terminate(relay)
        if relay.stdout is not None:
            relay.stdout.close()
        self.log.close()
        if (self.home / "node_key.json").exists():  # registered: off the committee for good
            _planet(self.own_env, "relay", "leave", "--home", str(self.home), timeout=60)


def _relay_start(env: dict[str, str], devnet: dict[str, Any], folder: Path) -> _RelayStart:
    """A Relay stake on anvil, credits a user bought handed to the relay, `planet relay serve`
    registering and redeeming them, the epoch's close paying the relay's address: up to the
    root posted (test_devnet_relay_redeems_credits_and_claims_its_row's first half, begun in
    the background by `head_starts`)."""
    from concurrent.futures import ThreadPoolExecutor

    from harness.ports import ephemeral_port
    from node.client.credit_wallet import CreditWallet
    from node.keys import create_dev_wallet, node_public_key
    from node.relay.earnings import SPOOL_DIR, Earnings
    from node.relay.run import load_or_create_key
    from protocol.committee.credit_holder import relay_party
    from tests.e2e.devnet_session import fund

    rpc = devnet["committee_rpc"][0]
    home, user_dir = folder / "relay", folder / "user"
    own_env = operator_env(env, home)
    relay_account = create_dev_wallet(home / "wallet.json", own_env["PLANET_PASSWORD"]).address
    user = create_dev_wallet(user_dir / "wallet.json", Path(devnet["password_file"]).read_text())
    pay = ["--wallet", str(user_dir / "wallet.json"), "--password-file", devnet["password_file"]]
    credits_file = user_dir / "credits.json"
    fund(env, relay_account, "1")

    def buy() -> None:  # the paying user: funded, a credits balance deposited, credits minted
        fund(env, user.address, "1")
        deposited = _planet(env, "balance", "deposit", "0.00001", "--credits", *pay)
        assert deposited.returncode == 0, deposited.stderr[-2000:]
        bought = _planet(env, "credits", "buy", str(RELAY_CREDITS), "--credits-file",
                         str(credits_file), *pay, timeout=240)  # fmt: skip
        assert bought.returncode == 0, bought.stderr[-2000:]

    with ThreadPoolExecutor(1) as pool:  # the user buys while the relay's operator stakes
        buying = pool.submit(buy)
        staked = _planet(own_env, "stake", "--role", "relay", "--amount", "0.1",
                         "--home", str(home))  # fmt: skip
        assert staked.returncode == 0, staked.stderr[-2000:]
        buying.result()
    # what the relay keeps of a PAY note: the credits, in <home>/relay-credits/
    # (holder-bound on the devnet: each given to the relay's X25519 key by its holder, as the
    # overlay client assigns a PAY note's credits)
    party = relay_party(load_or_create_key(home).public_key.encode())
    given = [credit.assign(party) for credit in CreditWallet(credits_file).take(RELAY_CREDITS)]
    assert Earnings(home / SPOOL_DIR).take(given) == RELAY_CREDITS

    log = (home / "relay.log").open("w")
    relay = spawn_piped(
        [sys.executable, "-m", "planet", "relay", "serve", "--home", str(home),
         "--port", str(ephemeral_port()), "--allow-private-next-hops"],
        stdout=subprocess.PIPE, stderr=log, text=True, env=own_env,
    )  # fmt: skip
    started = _RelayStart(home, own_env, relay_account, relay, log)
    try:
        assert relay.stdout is not None
        for expected in ("relay on", "registered relay"):
            line = relay.stdout.readline()
            assert line.startswith(expected), (line, (home / "relay.log").read_text()[-2000:])
        key = node_public_key(home / "node_key.json")
        [(epoch, _)] = _wait(lambda: _redeemed(rpc, key), 60, "the relay's redemption").items()
        started.epoch = epoch
        # the close of that epoch pays the relay's address on the pool's page, posted
        started.paid = _wait(lambda: _paid(devnet, [relay_account]), 90, "the relay's row posted")
    except BaseException:
        started.close()
        raise
    return started


def test_devnet_relay_redeems_credits_and_claims_its_row(env, devnet, head_starts) -> None:
    """A relay's pay on real processes (issue 43): a Relay stake on anvil, `planet relay serve`
    registering on the committee, credits a user bought on the devnet (`planet credits buy`)
    handed to the relay as a paying client's PAY cell hands them over (into its spool; the
    overlay path that carries them is tests/integration/test_paid_nodes.py's), the running relay
    redeeming them (`relay_redeem`) → the epoch's close pays its staking address credits · price
    on the credit pool's page, in a root the validators sign and post (`_relay_start`, begun
    before the module's first test) → `planet earnings` shows the row beside the credits →
    `planet claim --home <relay home>` (real QueryEscrow) pays exactly it."""
    from protocol.committee.settlement import statement_page

    rpc = devnet["committee_rpc"][0]
    price = int(_query(rpc, "/params")["genesis"]["credits"]["price_wei"])
    started: _RelayStart = head_starts["relay"].result()
    home, own_env, relay_account = started.home, started.own_env, started.relay_account
    try:
        epoch, paid = started.epoch, started.paid
        [(number, amount)] = paid[relay_account.lower()].items()
        assert statement_page(number)[0] == epoch and amount == RELAY_CREDITS * price
        view = _query(rpc, "/payouts", epoch=str(number))
        escrow_address = devnet["contracts"]["QueryEscrow"].lower()
        assert view["confirmed"] and [escrow_address] * 2 in [
            [p.lower(), g.lower()] for p, g in zip(view["payers"], view["gateways"], strict=True)
        ]
        # the relay operator's view: the row beside the credits redeemed in its epoch
        shown = _planet(own_env, "earnings", "--home", str(home), "--json", timeout=60)
        assert shown.returncode == 0, shown.stderr[-2000:]
        doc = json.loads(shown.stdout)
        assert {"epoch": epoch, "credits": RELAY_CREDITS, "due": str(amount),
                "paid": str(amount)} in doc["relay"]["epochs"]  # fmt: skip
        assert [(e["epoch"], e["amount"]) for e in doc["epochs"]] == [(number, str(amount))]

        # after the escrow's window, `planet claim` pays the relay's address exactly its row
        w3, escrow = escrow_contract(devnet)
        w3.provider.make_request("evm_increaseTime", [CHALLENGE_WINDOW_S + 1])
        w3.provider.make_request("evm_mine", [])
        claimed = _planet(own_env, "claim", "--home", str(home), timeout=120)
        assert claimed.returncode == 0, claimed.stderr[-2000:]
        [line] = claimed.stdout.splitlines()  # "claimed <eth> for epoch <E> (tx <hash>)"
        assert f" for epoch {number} " in line, line
        receipt = w3.eth.get_transaction_receipt(line.rsplit("(tx ", 1)[1].rstrip(")"))
        block, account = receipt["blockNumber"], w3.to_checksum_address(relay_account)
        received = w3.eth.get_balance(account, block) - w3.eth.get_balance(account, block - 1)
        total, collected = escrow.functions.shortfallOf(number).call()
        payable = amount * collected // total if total else amount
        assert received + receipt["gasUsed"] * receipt["effectiveGasPrice"] == payable > 0
        assert escrow.functions.claimed(number, account).call()
    finally:
        started.close()


def _debited_in(devnet: dict[str, Any], payer: str, query_id: str) -> dict[str, Any] | None:
    """The stored statement whose settled charges hold (payer, query id), once its root is
    posted on the escrow; None before (also when a busy RPC did not answer: asked again)."""
    try:
        _, escrow = escrow_contract(devnet)
        rpc = devnet["committee_rpc"][0]
        for summary in (_query(rpc, "/payouts") or {"epochs": []})["epochs"]:
            view = _query(rpc, "/payouts", epoch=str(summary["epoch"]))
            if any(c[0] == payer and c[3] == query_id for c in view.get("charges", [])):
                posted = escrow.functions.epochOf(summary["epoch"]).call()[3] == 1
                return view if posted else None
    except (OSError, ValueError) as error:
        print(f"_debited_in: {error!r}", file=sys.stderr)
    return None


@dataclass(frozen=True)
class _VoucherStart:
    """The voucher scenario's first half (`_voucher_start`): the payer, its gateway, its
    prepaid balance before the question, the question's charge and the posted statement."""

    payer: str
    gateway: str  # the gateway the balance is for
    before: int
    charge: Any  # node.gateway.settlement's charge item
    view: dict[str, Any]


def _voucher_start(env: dict[str, str], devnet: dict[str, Any], folder: Path) -> _VoucherStart:
    """A prepaid balance pays a question by voucher, up to the root debiting it posted
    (test_devnet_voucher_question_is_debited_…'s first half, begun in the background by
    `head_starts`)."""
    from node.gateway.settlement import charge_item
    from tests.e2e.devnet_session import new_user

    user = new_user(env, devnet, folder / "user")
    payer = user.address.lower()
    deposited = _planet(env, "balance", "deposit", "0.01", *user.pay_args(), timeout=120)
    assert deposited.returncode == 0, deposited.stderr[-2000:]
    w3, escrow = escrow_contract(devnet)
    with urllib.request.urlopen(devnet["gateway_url"] + "/v1/pools", timeout=10) as answer:
        gateway = json.load(answer)["data"][0]["gateway"]  # the balance is this gateway's
    before = escrow.functions.prepaidOf(w3.to_checksum_address(payer), gateway).call()[0]
    asked = _planet(env, "ask", "--voucher", *user.pay_args(), "--voucher-ttl", "3600",
                    "--json", "--max-tokens", "6", "Say yes.", timeout=300)  # fmt: skip
    assert asked.returncode == 0, asked.stderr[-3000:]
    charge = charge_item(json.loads(asked.stdout)["receipt"])
    assert charge is not None and charge.payer == payer and charge.total > 0

    view = _wait(lambda: _debited_in(devnet, payer, charge.id), 240, "the charge posted")
    return _VoucherStart(payer, gateway, before, charge, view)


def test_devnet_voucher_question_is_debited_in_a_posted_root_claimed_and_replay_refused(
    env, devnet, head_starts
) -> None:
    """a prepaid balance pays a question by voucher → the gateway's work_report carries the
    charge → the gateway's page of the epoch's statements debits the payer → the relayed root
    takes exactly that debit from the payer's balance on anvil (`_voucher_start`, begun before
    the module's first test) → the gateway claims it (it paid the nodes with its own credits);
    the same charge sent again by the gateway changes nothing (charges are cumulative: never
    debited twice)."""
    if not devnet.get("gateway_url"):
        pytest.skip("this checkout has no gateway")
    from node.keys import load_node_key
    from protocol.committee.settlement import WorkReport

    password = Path(devnet["password_file"]).read_text()
    started: _VoucherStart = head_starts["voucher"].result()
    payer, charge, view = started.payer, started.charge, started.view
    w3, escrow = escrow_contract(devnet)
    balance_of = escrow.functions.prepaidOf(w3.to_checksum_address(payer), started.gateway)
    epoch = view["epoch"]
    assert view["payers"] == [payer] and view["debits"] == [str(charge.total)]
    assert view["gateways"] == [charge.gateway]
    # payer, gateway, kind, id, total: no node, circuit or session
    assert all(len(settled) == 5 for settled in view["charges"])
    after = balance_of.call()[0]
    assert after == started.before - charge.total  # the posted root debited exactly the fee
    assert int(view["total"]) == sum(int(f) for f in view["fees"]) + charge.total

    # the gateway's own page: one row, the gateway, for everything it charged in it
    gateway_home, gateway = _gateway_account(devnet)
    assert view["rows"] == [[gateway, view["total"]]]
    # the gateway claims the page the voucher paid (after the escrow's window)
    w3.provider.make_request("evm_increaseTime", [CHALLENGE_WINDOW_S + 1])
    w3.provider.make_request("evm_mine", [])
    before_claim = w3.eth.get_balance(w3.to_checksum_address(gateway))
    claimed = _planet(env, "claim", "--epoch", str(epoch), "--home", gateway_home,
                      "--password-file", devnet["password_file"], timeout=120)  # fmt: skip
    assert claimed.returncode == 0, claimed.stderr[-2000:]
    tx = claimed.stdout.strip().splitlines()[-1].rsplit("(tx ", 1)[1].rstrip(")")
    receipt = w3.eth.get_transaction_receipt(tx)
    gas = receipt["gasUsed"] * receipt["effectiveGasPrice"]
    after_claim = w3.eth.get_balance(w3.to_checksum_address(gateway))
    assert after_claim == before_claim + int(view["total"]) - gas

    # the gateway sends the same charge again: charged already, the report changes nothing
    key = load_node_key(Path(devnet["dir"]) / "gateway" / "committee_key.json", password)

    code, log = _send_signed(key, devnet, WorkReport((), (charge,)))
    assert code == 0, log


def _second_gateway(
    env: dict[str, str], devnet: dict[str, Any], home: Path
) -> tuple[Child, str, str, Path]:
    """`planet gateway serve` with a fresh wallet of its own (funded; a balance at the escrow for
    its credits), on a port of this test run's range: (process, URL, address, log)."""
    import os
    import socket

    from node.chain.evm.account import PlanetChain
    from node.chain.evm.deployment import Deployment
    from node.keys import create_dev_wallet
    from tests.e2e.devnet_session import fund

    password_file = devnet["password_file"]
    account = create_dev_wallet(home / "wallet.json", Path(password_file).read_text())
    fund(env, account.address, "3")
    deployment = Deployment.load(devnet["deployment"])
    chain = PlanetChain(deployment, bytes(account.key))
    chain.escrow.deposit_balance(deployment.address("QueryEscrow"), 10**18)  # buys its credits
    low, high = (int(p) for p in os.environ.get("PLANET_TEST_PORTS", "12500-12999").split("-"))
    port = next(p for p in range(high, low, -1) if socket.socket().connect_ex(("127.0.0.1", p)))
    rpcs = [a for url in devnet["committee_rpc"] for a in ("--validator-rpc", url)]
    log = home / "gateway.log"
    argv = [sys.executable, "-m", "planet", "gateway", "serve",
            "--evm-rpc", devnet["evm_rpc"], "--deployment", devnet["deployment"],
            "--committee-rpc", devnet["committee_rpc"][0], "--manifest", devnet["manifest"],
            "--wallet", str(home / "wallet.json"), "--password-file", password_file,
            "--host", "127.0.0.1", "--port", str(port), "--report-min-questions", "1",
            "--private-endpoints", "--credits-file", str(home / "credits.json"),
            "--top-up-below", "20", "--top-up", "60", *rpcs]  # fmt: skip
    with open(log, "wb") as out:
        process = spawn_piped(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    return process, f"http://127.0.0.1:{port}", account.address.lower(), log


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


@dataclass
class _Gateway2Start:
    """The second gateway's scenario's first half (`_gateway2_start`): its home, process, URL,
    address and log, the user who asked through it, and the posted roots paying it."""

    home: Path
    user: User
    process: Child
    url: str
    gateway2: str
    log: Path
    paid: dict[str, dict[int, int]] = field(default_factory=dict)  # _paid's answer

    def close(self) -> None:
        """Stop the second gateway (SIGTERM, then SIGKILL after a minute)."""
        terminate(self.process, grace_s=60)


def _gateway2_start(env: dict[str, str], devnet: dict[str, Any], folder: Path) -> _Gateway2Start:
    """A second `planet gateway serve` with a fresh wallet, up and bound, a user's per-query
    deposit to it asked and settled, up to the root paying it posted (test_devnet_a_second_
    gateway_…'s first half, begun in the background by `head_starts`)."""
    from tests.e2e.devnet_session import new_user

    user = new_user(env, devnet, folder / "user")
    home = folder / "gateway2"
    home.mkdir()
    process, url, gateway2, log = _second_gateway(env, devnet, home)
    started = _Gateway2Start(home, user, process, url, gateway2, log)
    try:
        _wait(lambda: _healthy(url) or process.poll() is not None, 300, "the second gateway up")
        assert process.poll() is None, log.read_text()[-3000:]
        assert "gateway bound: committee key " in log.read_text()  # said before serving
        rpc = devnet["committee_rpc"][0]
        assert gateway2 in _query(rpc, "/gateways")["gateways"].values()
        for _ in range(3):  # its first credits may still be in flight (mints are blind-signed)
            asked = _planet(env, "ask", "--pay", "--gateway", url, *user.pay_args(),
                            "--max-tokens", "4", "Say hello.", timeout=300)  # fmt: skip
            if asked.returncode == 0:
                break
            time.sleep(10)
        assert asked.returncode == 0, asked.stderr[-3000:] + log.read_text()[-3000:]
        paid = _wait(lambda: _paid(devnet, [gateway2]), 120, "the second gateway paid in a root")
        assert paid is not None
        started.paid = paid
    except BaseException:
        started.close()
        raise
    return started


def test_devnet_a_second_gateway_binds_itself_is_paid_its_users_fees_and_not_the_firsts(
    env, devnet, head_starts
) -> None:
    """No genesis change: a second `planet gateway serve` with a fresh wallet binds its committee
    key to its wallet on first start and says so → a user's per-query deposit to it is settled on
    its own page (one row: itself) (`_gateway2_start`, begun before the module's first test) →
    it claims exactly that → a statement paying it a deposit made for the first gateway cannot
    be posted, even with every committee signature."""
    if not devnet.get("gateway_url"):
        pytest.skip("this checkout has no gateway")
    from node.chain.evm.account import PlanetChain
    from node.chain.evm.deployment import Deployment
    from node.chain.evm.errors import ContractRevert
    from node.keys import load_wallet, read_operator_key
    from protocol.eip712 import PayoutRoot, committee_domain, committee_signatures, queries_hash
    from shares.merkle import leaf_hash

    started: _Gateway2Start = head_starts["gateway2"].result()
    home, gateway2, fresh_user = started.home, started.gateway2, started.user
    try:
        rpc = devnet["committee_rpc"][0]
        [(epoch, amount)] = started.paid[gateway2].items()
        view = _query(rpc, "/payouts", epoch=str(epoch))
        assert view["rows"] == [[gateway2, str(amount)]] and view["query_ids"]
        w3, escrow = escrow_contract(devnet)
        w3.provider.make_request("evm_increaseTime", [CHALLENGE_WINDOW_S + 1])
        w3.provider.make_request("evm_mine", [])
        claimed = _planet(env, "claim", "--epoch", str(epoch), "--home", str(home),
                          "--password-file", devnet["password_file"], timeout=120)  # fmt: skip
        assert claimed.returncode == 0, claimed.stderr[-2000:]
        assert escrow.functions.claimed(epoch, w3.to_checksum_address(gateway2)).call()
    finally:
        started.close()

    # a deposit made for the first gateway cannot be paid to the second, whoever signs
    _, first = _gateway_account(devnet)
    password = Path(devnet["password_file"]).read_text()
    deployment = Deployment.load(devnet["deployment"])
    user = PlanetChain(deployment, bytes(load_wallet(fresh_user.wallet, password).key))
    theirs, mine = b"\x45" * 32, b"\x46" * 32
    first, gateway2 = w3.to_checksum_address(first), w3.to_checksum_address(gateway2)
    user.escrow.deposit(theirs, bytes(32), first, 10**12)
    user.escrow.deposit(mine, bytes(32), gateway2, 10**12)
    committee_dir = Path(devnet["committee_dir"])
    keys = [read_operator_key(committee_dir / f"node{i}" / "config" / "operator_key.json")
            for i in range(4)]  # fmt: skip
    domain = committee_domain(deployment.chain_id, deployment.address("Committee"))
    for number, ids, reason in ((10**6 + 1, [theirs], "RootNotPayee"),
                                (10**6 + 2, [mine, theirs], "WrongGatewayQuery")):  # fmt: skip
        fees = [10**12] * len(ids)
        statement = PayoutRoot(
            epoch=number,
            root=leaf_hash(number, gateway2, sum(fees)),
            total=sum(fees),
            queries_hash=queries_hash(ids, fees),
            consumer=deployment.address("QueryEscrow"),
        )
        sigs = committee_signatures(statement, keys, domain)
        with pytest.raises(ContractRevert) as refused:
            user.escrow.post_payout_root(statement, ids, fees, sigs)
        assert refused.value.error_name == reason
    assert user.escrow.is_funded(theirs)


def test_devnet_node_without_attested_stake_is_never_routable(env, devnet, tmp_path) -> None:
    """A fresh wallet with no stake serves a node under its own key and registers it through a
    real agent process: the committee lists it SERVING, the watchers attest 0, and it never
    becomes routable."""
    from node.keys import create_dev_wallet, create_node_key
    from node.server.launcher import free_ports, start_node, stop_pid, wait_healthy

    home = tmp_path / "unstaked"
    create_dev_wallet(home / "wallet.json", "pw")
    node_key = create_node_key(home / "node_key.json", "pw").verify_key.encode().hex()
    # its own node: the agent checks that its endpoint proves this key (TLS bound to it)
    node = start_node(
        manifest=Path(devnet["manifest"]),
        shard=0,
        port=free_ports(1, 19100, 19900)[0],
        run_dir=home / "run",
        extra_env={"PLANET_PASSWORD": "pw"},
        node_key=home / "node_key.json",
    )
    try:
        wait_healthy([node], timeout_s=120)
        _unstaked_agent_is_never_routable(env, devnet, home, node_key, node.url)
    finally:
        stop_pid(node.pid)


def _height(devnet: dict[str, Any]) -> int:
    """The committee's latest block height (validator 0's CometBFT)."""
    with urllib.request.urlopen(devnet["committee_rpc"][0] + "/status", timeout=10) as answer:
        return int(json.load(answer)["result"]["sync_info"]["latest_block_height"])


def _unstaked_agent_is_never_routable(
    env: dict[str, str], devnet: dict[str, Any], home: Path, node_key: str, endpoint: str
) -> None:
    log_path = home / "agent.log"
    with open(log_path, "wb") as log_file:
        agent = spawn_piped(
            [
                sys.executable, "-m", "node.agent", "--home", str(home),
                "--manifest", devnet["manifest"], "--shard", "0", "--endpoint", endpoint,
                "--committee-rpc", devnet["committee_rpc"][1],
            ],
            env={**env, "PLANET_PASSWORD": "pw"},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        seen = []

        def serving_and_attested() -> bool:
            view = _view(devnet, node_key)
            if view is not None:
                seen.append(view)
            return bool(view and view["status"] == "SERVING" and view["stake_attestations"] >= 3)

        _wait(serving_and_attested, 60, f"the unstaked node to be SERVING ({log_path})")
        # still unroutable over the next blocks (each block recomputes routability)
        start = _height(devnet)
        _wait(lambda: seen.append(_view(devnet, node_key)) or _height(devnet) >= start + 5, 30,
              "5 more committee blocks")  # fmt: skip
        assert all(not v["routable"] for v in seen)
        assert seen[-1]["stake"] == "0"
        listed = _nodes(devnet["committee_rpc"][0], model=devnet["model_hash"])
        assert node_key not in {n["key"] for n in listed if n["routable"]}
    finally:
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(30) == 0, log_path.read_text()[-2000:]
    # clean shutdown sent `leave` and saw it commit (through validator 1): validator 0, which
    # `_view` reads, may apply that block a moment later (CI of d51f01d on a loaded box)
    _wait(lambda: _view(devnet, node_key)["status"] == "LEFT", 30, "validator 0 to see LEFT")


def test_devnet_unstake_makes_the_node_unroutable(env, devnet, new_operator) -> None:
    """An operator of the test's own (funded, staked, joined to shard 1) unstakes: the watchers
    attest 0 and its node, still SERVING, is no longer routable."""
    operator = new_operator(1)
    home, key = str(operator.home), operator.node_key
    assert _wait(lambda: (v := _view(devnet, key)) and v["routable"], 60, "the node routable")
    done = _planet(operator.env, "unstake", "--home", home, timeout=90)
    assert done.returncode == 0, done.stderr
    view = _wait(
        lambda: (v := _view(devnet, key)) and v["stake"] == "0" and v,
        60,
        "the watchers to attest 0 after unstake",
    )
    assert view["status"] == "SERVING" and not view["routable"]
    status = _planet(operator.env, "status", "--json", "--home", home, timeout=60)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["stake"]["status"] == "unbonding"
    assert report["committee"]["routable"] is False


def test_devnet_new_operator_funds_stakes_joins_and_leaves_dropping_out_of_the_routable_set(
    env, devnet, fresh_user, tmp_path
) -> None:
    """A new operator home with no config: every command finds the running devnet by itself.
    The first `stake` says how to fund the new wallet; `devnet fund` funds it; `devnet status`
    lists it; stake, join shard 2 with no price flag (a paid node at the pool's going price,
    registered on the chain, and paid: the gateway's credits for a user's questions, redeemed
    at that price), routable: two nodes serve it), status, and `leave` reaching
    the committee: LEFT, out of the routable set and of /nodes, shard 2 back to one routable
    node, its node and agent stopped. (This test also holds what test_devnet_node_that_leaves_
    drops_out_of_the_routable_set checked, with a genesis node, before the devnet was shared.)"""
    home = str(tmp_path / "new-operator")
    operator = operator_env(env, Path(home))
    try:
        _new_operator_joins_and_leaves(env, devnet, operator, home, fresh_user.pay_args())
    finally:
        release_operator(operator, Path(home))


def _new_operator_joins_and_leaves(
    env: dict[str, str],
    devnet: dict[str, Any],
    operator: dict[str, str],
    home: str,
    pay_args: list[str],
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from node.keys import wallet_address

    broke = _planet(operator, "stake", "--role", "compute", "--amount", "1", "--home", home)
    assert broke.returncode != 0 and "Traceback" not in broke.stderr
    address = wallet_address(Path(home) / "wallet.json")  # the wallet `stake` made
    assert f"hint: send ETH to {address} (on a devnet: planet devnet fund {address} 10)" in (
        broke.stderr
    )
    funded = _planet(env, "devnet", "fund", address, "--json", timeout=60)
    assert funded.returncode == 0, funded.stderr
    assert int(json.loads(funded.stdout)["balance_wei"]) >= 10 * 10**18
    with ThreadPoolExecutor(max_workers=1) as pool:  # the two status commands side by side
        as_json = pool.submit(_status, env)
        listed = _planet(env, "devnet", "status", timeout=60)
        assert listed.returncode == 0 and address in listed.stdout
        assert address in [a["address"] for a in as_json.result()["accounts"]]
    staked = _planet(operator, "stake", "--role", "compute", "--amount", "1", "--home", home)
    assert staked.returncode == 0, staked.stderr
    model = Path(devnet["manifest"]).parent.name
    joined = _planet(
        operator, "join", "--model", model, "--shard", "2", "--home", home, timeout=300
    )
    assert joined.returncode == 0, joined.stderr
    status = _planet(operator, "status", "--json", "--home", home, timeout=60)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["evm_rpc"] == devnet["evm_rpc"]
    assert report["committee_rpc"] == devnet["committee_rpc"][0]
    assert report["committee"]["routable"] is True and report["local"]["node_alive"]
    key = report["node_key"]
    pids = json.loads((Path(home) / "run" / "joined.json").read_text())
    rpc = devnet["committee_rpc"][0]
    pool = _query(rpc, "/pool_health", model=devnet["model_hash"])
    assert pool["routable_per_shard"][2] == 2  # the genesis node2 and this one
    _new_node_is_paid_its_going_price(env, devnet, joined.stderr, key, address, pay_args)

    left = _planet(operator, "leave", "--now", "--home", home, timeout=90)
    assert left.returncode == 0, left.stderr
    assert "chain status LEFT" in left.stdout and "unreachable" not in left.stdout + left.stderr
    view = _view(devnet, key)
    assert view["status"] == "LEFT" and not view["routable"]
    listed_nodes = _nodes(rpc, model=devnet["model_hash"])
    assert key not in {n["key"] for n in listed_nodes if n["routable"]}
    pool = _query(rpc, "/pool_health", model=devnet["model_hash"])
    assert pool["routable_per_shard"] == [1, 1, 1]
    assert not pid_alive(pids["agent_pid"]) and not pid_alive(pids["node_pid"])


def _new_node_is_paid_its_going_price(
    env: dict[str, str],
    devnet: dict[str, Any],
    said: str,
    key: str,
    address: str,
    pay_args: list[str],
) -> None:
    """`planet join` without a price flag: the pool's going price (the genesis nodes charge 64),
    registered on the chain by the agent; the gateway pays the node at that price (its router
    reads it from `/nodes`), and the agent redeems what it was paid."""
    rpc, model = devnet["committee_rpc"][0], devnet["model_hash"]
    assert "price: a credit per 64 positions (the pool's going price" in said, said
    [row] = _query(rpc, "/prices", model=model, node=key)["prices"]
    assert row["positions"] == 64 and row["shard"] == 2, row
    listed = _query(rpc, "/prices", model=model)  # a devnet's prices fit one page
    assert listed["next"] is None
    assert going_price([r["positions"] for r in listed["prices"] if r["positions"]]) == 64
    if not devnet.get("gateway_url"):
        return
    since = _query(rpc, "/epochs")["current"]

    def redeemed() -> int:
        current = _query(rpc, "/credits", account=address)["epoch"]
        credited = sum(
            c["layer_tokens"]
            for epoch in range(max(1, since - 1), current + 1)
            for c in _query(rpc, "/credits", account=address, epoch=str(epoch))["credits"]
        )
        if credited:
            return credited
        # an epoch's credit rows go at its close, into its payout statement: a redemption whose
        # epoch closed between two reads shows there (the shared devnet's epochs are ~6 s)
        listing = _query(rpc, "/payouts") or {"epochs": []}
        return sum(
            int(amount)
            for summary in listing["epochs"]
            if summary["epoch"] >= since - 1
            for account, amount in _query(rpc, "/payouts", epoch=str(summary["epoch"]))["rows"]
            if account.lower() == address.lower()
        )

    for question in QUESTIONS:
        asked = _planet(env, "ask", "--pay", *pay_args, "--json", "--max-tokens", "6", question,
                        timeout=300)  # fmt: skip
        assert asked.returncode == 0, asked.stderr[-3000:]
        # the gateway explores a node it has not seen first: it serves within a few questions;
        # one its circuit did not take (the receipt's nodes) is not waited for
        served = key in json.loads(asked.stdout)["receipt"]["nodes"]
        try:
            _wait(redeemed, 90 if served else 5, "the new node's credits redeemed", every_s=2.0)
            return
        except AssertionError:
            continue
    raise AssertionError("the new operator's node was never paid for the questions it served")


def test_bench_devnet_quick_measures_the_shared_devnet(shared_devnet_dir: Path) -> None:
    """`bench/devnet.py --quick --devnet DIR`, run as its doc says, measures the running devnet
    (the start-up figures it recorded, `planet status`, the `/node` query, a block interval) and
    prints one benchmark object; the devnet's processes are left as they were (issue 41: the
    bench's smoke without a devnet of its own)."""
    before = json.loads((shared_devnet_dir / "devnet.json").read_text())
    completed = run_bench("devnet", "--quick", "--devnet", str(shared_devnet_dir), timeout_s=300)
    one_benchmark_object(completed, "devnet")
    body = json.loads(completed.stdout)
    assert body["bench"] == "devnet" and body["config"]["devnet"].startswith("attached: ")
    after = json.loads((shared_devnet_dir / "devnet.json").read_text())
    assert pids_alive(before) == pids_alive(after)


def test_devnet_up_twice_refuses_and_down_is_idempotent(env, devnet) -> None:
    again = _planet(env, "devnet", "up", "--detach", timeout=60)
    assert again.returncode == 2
    assert "error: a devnet already runs" in again.stderr and "hint:" in again.stderr
    assert "Traceback" not in again.stderr


def test_devnet_node_convicted_by_its_versions_quorum_is_ratified_and_slashed(
    env, devnet, new_operator
) -> None:
    """Validators 0 and 1 announce their verifiers run this release's numerics (the shared
    devnet runs no verifiers: the others announce nothing), so from the next epoch the version
    of every node is checked by a group of 20 of the 40 power. Their two verdict votes against
    an operator of the test's own convict it by that group's quorum — half of all the power,
    short of the 2/3 FraudProofs checks — and the stake watchers of validators 2 and 3 ratify
    the verdict (`verdict_ratify`): its signatures reach 2/3, it is relayed, and the node's
    stake on anvil drops (on main it stayed whole: the watchers withheld the verdict)."""
    import asyncio

    from web3 import Web3

    from deploy.committee.network import load_network
    from node.chain.committee_link import CommitteeLink, signer_nonce_file
    from node.keys import operator_key_path, read_operator_key
    from node.watcher.__main__ import consensus_key
    from protocol.committee.verification import VerdictVote, VerifierNumerics
    from protocol.eip712 import OFFENCE_FAILED_VERIFICATION, Verdict, committee_domain
    from protocol.numerics import NUMERICS
    from tests.e2e.devnet_session import shared_verifiers

    if shared_verifiers():
        pytest.skip("the devnet's own verifiers announce their numerics (PLANET_E2E_VERIFIERS)")
    rpc = devnet["committee_rpc"][0]
    validators = load_network(Path(devnet["committee_dir"])).validators
    deployment = json.loads(Path(devnet["deployment"]).read_text())
    fraud_proofs = deployment["contracts"]["FraudProofs"]["address"]
    committee = deployment["contracts"]["Committee"]["address"]
    domain = committee_domain(int(deployment["chain_id"]), committee)

    async def send(index: int, body: Any) -> tuple[int, str]:
        home = Path(validators[index].home)
        link = CommitteeLink(
            [validators[index].rpc_url], consensus_key(home), nonce_file=signer_nonce_file(home)
        )
        try:
            return await link.send(body, timeout_s=30)
        finally:
            await link.close()

    async def both(bodies: dict[int, Any]) -> list[tuple[int, str]]:
        return list(await asyncio.gather(*(send(i, b) for i, b in bodies.items())))

    numerics_unchanged = 107  # abci_app/codes.py: announced by an earlier run of this test
    announced = asyncio.run(both({0: VerifierNumerics(NUMERICS), 1: VerifierNumerics(NUMERICS)}))
    assert all(code in (0, numerics_unchanged) for code, _ in announced), announced
    operator = new_operator(1)  # joins while the announcements wait for their epoch
    view = _wait(lambda: _view(devnet, operator.node_key), 60, "the node registered")
    address = Web3.to_checksum_address(view["evm_address"])

    def group_checked() -> bool:
        groups = {v["numerics"]: v for v in _query(rpc, "/numerics")["versions"]}
        return groups[NUMERICS]["checked"] and len(groups[NUMERICS]["verifiers"]) == 2

    _wait(group_checked, 60, "validators 0 and 1 in the release's numerics group")
    verdict = Verdict(
        node=address,
        offence=OFFENCE_FAILED_VERIFICATION,
        evidence_hash=bytes.fromhex(operator.node_key),  # 32 bytes of its own
        challenger=validators[0].operator_address,
        nonce=int(operator.node_key[:15], 16),  # single-use on FraudProofs
        consumer=fraud_proofs,
    )

    def vote(index: int) -> VerdictVote:
        key = read_operator_key(operator_key_path(Path(validators[index].home)))
        return VerdictVote(
            node=verdict.node,
            offence=verdict.offence,
            evidence_hash="0x" + verdict.evidence_hash.hex(),
            challenger=verdict.challenger,
            verdict_nonce=verdict.nonce,
            signature="0x" + verdict.sign(key, domain).hex(),
        )

    voted = asyncio.run(both({0: vote(0), 1: vote(1)}))
    assert [code for code, _ in voted] == [0, 0], voted
    ident = "0x" + verdict.struct_hash().hex()
    half = int(_query(rpc, "/numerics")["total_power"]) // 2  # validators 0 and 1: 10 of 40 each
    record = _wait(
        lambda: (r := _query(rpc, "/verdicts", id=ident)) and r["power"] == half and r,
        30,
        "validator 0 to apply both votes",
    )
    assert record["confirmed"] and record["quorum_numerics"] == NUMERICS

    staking = deployment["contracts"]["Staking"]
    w3 = Web3(Web3.HTTPProvider(devnet["evm_rpc"]))
    contract = w3.eth.contract(address=staking["address"], abi=staking["abi"])
    _wait(lambda: contract.functions.stakeOf(address).call() < 10**18, 90, "the node slashed")
    record = _query(rpc, "/verdicts", id=ident)
    assert record["relayable"] and len(record["signers"]) >= 3  # 2/3 of 4 equal powers
    ratified_by = {o.lower() for o in record["ratifiers"]}
    assert ratified_by and ratified_by <= {v.operator_address.lower() for v in validators[2:]}
    assert contract.functions.stakeOf(address).call() == 10**18 // 2  # failed verification: 50 %
