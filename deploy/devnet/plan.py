"""What a devnet is: its options, its sizes and money, and its state file (`devnet.json`)."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.eth import WEI_PER_ETH as ETHER  # not deploy.evm: web3 + eth-account, ~1.4 CPU-s

Progress = Callable[[str], None]
STATE_FILE = "devnet.json"
OPERATOR_FUNDS_WEI = 10 * ETHER
USER_FUNDS_WEI = 100 * ETHER
COMPUTE_STAKE_ETH = "1"
# The test entry point that joins a cheating node (`planet join` + `--cheat MODE`), and the one
# its node runs as: the product has no cheat mode, `--cheat-node` points the launcher here.
CHEAT_JOIN_MODULE = "tests.doubles.cheating_join"
CHEAT_NODE_MODULE = "tests.doubles.cheating_node"
DEVNET_EPOCH_LENGTH = 20  # ≈ 6-10 s at the devnet's 300 ms blocks: settlement within a minute
# Settled epochs whose records stay (payout statements and claim proofs among them): the
# genesis default 10 is only ~1-2 minutes of 20-block epochs, too short to claim by hand
# after the escrow's 60 s window; 360 ≈ 40-60 minutes.
DEVNET_RETENTION_EPOCHS = 360
OPERATOR_GAS_WEI = 10**18  # each validator's operator key pays for relaying payout roots
# Bearer credits on sale (`planet credits buy`, docs/credits.md): 10^12 wei each, worth 4096
# layer-tokens of a node's work when redeemed.
# holder_bound: a credit is locked or redeemed only with its holder's assignment to the node or
# relay that does it (docs/credits.md, "Who may lock or redeem a credit"): a copied lock or
# redemption from the mempool is refused
DEVNET_CREDITS = {"price_wei": str(10**12), "layer_tokens": 4096, "holder_bound": True}
# The compute nodes charge bearer credits (`planet join --credit-positions`): a credit per 64
# positions. The gateway pays them with credits it buys as it runs low (node/gateway/topup.py)
# from a balance the devnet deposits for it at the escrow's own address: 1 ETH is 10^6 credits
# at DEVNET_CREDITS' price, ~10^5 questions of ~10 credits on 3 shards. Credits need the key
# period's committee key: every validator's stake watcher takes part in its DKG
# (node/watcher/credit_dkg.py), with or without --verifiers; a new devnet has it after its
# first ~3 · dkg_phase_blocks blocks, and a purchase waits for it.
DEVNET_CREDIT_POSITIONS = 64
GATEWAY_CREDIT_DEPOSIT_WEI = ETHER
GATEWAY_FUNDS_WEI = 2 * ETHER  # the gateway wallet: the deposit and its gas
GATEWAY_TOP_UP_BELOW = 200  # the gateway buys when it holds fewer credits ...
GATEWAY_TOP_UP = 600  # ... this many, in mints of 30 (the verifiers ask through it too)
GATEWAY_READY_CREDITS = 90  # `up` waits until it holds this many (3 mints), the rest follows
GATEWAY_CREDITS_WAIT_S = 240.0
# The second model (second_model.py): the whole model as one int8 shard, another model hash
SECOND_MODEL_PARTS = 1
SECOND_MODEL_QUANT = "int8"


@dataclass(frozen=True)
class LinkPlan:
    """How `--hosts` shapes every link: a flat one-way delay, else a latency matrix (default:
    deploy/netlab/regions.csv) with the hosts placed in its regions in turn."""

    link_ms: int | None = None
    matrix: Path | None = None
    kbytes_per_s: int | None = None  # per connection and direction; None: unlimited

    def describe(self) -> str:
        rate = f", {self.kbytes_per_s} kB/s per connection" if self.kbytes_per_s else ""
        if self.link_ms is not None:
            return f"every link {self.link_ms} ms one way{rate}"
        return f"latency matrix {self.matrix or 'deploy/netlab/regions.csv'}{rate}"


@dataclass(frozen=True)
class DevnetOptions:
    home: Path  # PLANET_HOME
    validators: int = 4
    nodes: int = 3
    nodes_note: str = ""  # how the node count was chosen (deploy/devnet/replicas.py), shown
    quant: str = "int8"
    gateway: bool = True
    join_timeout_s: float = 240.0
    epoch_length: int = DEVNET_EPOCH_LENGTH  # committee blocks per settlement epoch
    verifiers: int | None = None  # `planet verifier serve` for the first N validators (None:
    # every validator, so the verifiers' reports reach the 2/3 that reputation and verdicts need)
    cheat_nodes: tuple[str, ...] = ()  # extra nodes joined with a cheat mode (tests, demos)
    hosts: LinkPlan | None = None  # every process in its own network namespace (`--hosts`)
    operator_hosts: int = 1  # with hosts: empty hosts operator0… for new operators
    relay_hosts: int = 0  # with hosts: empty hosts relay0… for `planet relay serve`
    nat_hosts: int = 0  # with hosts: hosts nat0… behind NAT (routers router0…)
    # each compute node's price, positions per credit (0: free; None: DEVNET_CREDIT_POSITIONS)
    credit_positions: int | None = None
    # the gateway's `--node-cooldown-s` (None: its own default, 30 s)
    gateway_node_cooldown_s: float | None = None
    # each verifier's `--challenges-per-epoch` (None: its default; 0: spot checks only)
    verifier_challenges: int | None = None
    # register and serve a second model in node0's process (second_model.py); `--one-model`
    second_model: bool = True

    @property
    def dir(self) -> Path:
        return devnet_dir(self.home)

    @property
    def verifier_count(self) -> int:
        return self.validators if self.verifiers is None else self.verifiers

    @property
    def node_price(self) -> int:
        """What each compute node charges: a credit per this many positions (0: free). Credits
        can always be minted: every validator's watcher publishes its credit keys."""
        if self.credit_positions is not None:
            return self.credit_positions
        return DEVNET_CREDIT_POSITIONS

    @property
    def shards(self) -> int:
        """The first model's shards: 3 (SmolLM2's 30 layers as 10+10+10), or fewer nodes."""
        return min(self.nodes, 3)

    @property
    def with_second_model(self) -> bool:
        """Whether a second model is registered and served (second_model.py): asked for, and
        the first is not that very set (`--nodes 1 --quant int8`)."""
        first = (self.shards, self.quant)
        return self.second_model and first != (SECOND_MODEL_PARTS, SECOND_MODEL_QUANT)

    @property
    def all_nodes(self) -> int:
        """Compute nodes in all: the honest ones, then the cheating ones."""
        return self.nodes + len(self.cheat_nodes)


def devnet_dir(home: Path) -> Path:
    return home / "devnet"


def read_state(directory: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((directory / STATE_FILE).read_text()))
    except (OSError, ValueError):
        return None


def write_state(directory: Path, state: dict[str, Any]) -> None:
    tmp = directory / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.replace(directory / STATE_FILE)


@contextmanager
def state_lock(directory: Path) -> Iterator[None]:
    """Hold the devnet.json lock (an flock on devnet.json.lock) around a read-modify-write of
    the state by a command that may run beside others of its kind (`planet devnet fund`, which
    also sends its transfer under it: deploy/devnet/fund.py `_send`)."""
    with (directory / (STATE_FILE + ".lock")).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
