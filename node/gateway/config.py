"""GatewayConfig: everything `planet gateway serve` needs, validated once at start."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from node.gateway.credit_defaults import MAX_TOP_UP, MIN_CREDIT_POSITIONS, TOP_UP, TOP_UP_BELOW
from node.gateway.requests import Limits
from protocol.errors import UsageError
from protocol.frames.dtypes import WIRE_DTYPE, WIRE_DTYPES

DEFAULT_PRICE_WEI_PER_TOKEN = 10**12
# a node that failed a question sits out this long by default (seconds; router.py)
NODE_COOLDOWN_S = 30.0


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    evm_rpc: str  # EVM JSON-RPC URL (QueryEscrow lives there)
    deployment: Path  # deploy/evm.py Deployment JSON (addresses + ABIs)
    committee_rpc: str  # one validator's CometBFT RPC URL
    manifest: Path  # model manifest; the gateway holds its client part
    wallet: Path  # gateway keystore (signs receipts), created on first use
    price_wei_per_token: int = DEFAULT_PRICE_WEI_PER_TOKEN  # wei per prompt or completion token
    host: str = "127.0.0.1"
    port: int = 8000
    receipts: Path | None = None  # JSON-lines receipt log (None: next to the wallet)
    max_body_bytes: int = 1 << 20  # largest request body accepted (bytes)
    node_timeout_s: float = 60.0  # one HTTP exchange with a node (seconds)
    routing_refresh_s: float = 2.0  # how stale the routable-node list may be (seconds)
    attempts: int = 5  # circuits per question, failovers included (node/gateway/engine.py)
    stall_s: float = 10.0  # a circuit silent this long mid-answer is stalled: fail over (s)
    # a node that failed a question sits out this long before it is routed again (seconds;
    # `--node-cooldown-s`); a devnet with one node per shard sets it short
    node_cooldown_s: float = NODE_COOLDOWN_S
    # guesses per decode pass (prompt lookup, node/client/speculation.py); 0: one token a pass.
    # Rejected guesses are positions the nodes compute that no user pays for (docs/gateway.md)
    speculate: int = 0
    # the circuit's first node runs the decode loop (docs/overlay.md, *The ring*) where every
    # node of a circuit takes it; the gateway checks each token it is sent (`--ring`)
    ring: bool = False
    max_sessions_per_node: int = 16  # questions at once on one node from this gateway (queue after)
    slot_wait_s: float = 120.0  # longest a question queues for node slots before 503 (seconds)
    report_min_questions: int = 4  # questions batched per work_report (fewer: wait, see below)
    report_max_wait_s: float = 60.0  # longest a smaller batch waits before it is reported (s)
    # every question's prompt frames ask the last node for all positions (as echo needs), so
    # nodes cannot tell echo requests (verifier challenges) from other questions; costs the
    # last node's answer T x H floats once per question
    full_prefill: bool = True
    report_every_s: float = 5.0  # the reporter's pass interval (seconds)
    # refuse per-query deposits whose refund opens within this (s); None: derived from the
    # settlement timeline at start (timeline.py), and checked against the escrow's refundTimeout
    refund_margin_s: int | None = None
    committee_block_s: float = 1.0  # committee block interval assumed by the timeline (seconds)
    commit_margin_s: float = 120.0  # a report reaches a committee block within this (seconds)
    posting_margin_s: float = 120.0  # the committee signs and posts an epoch's root within (s)
    max_voucher_lifetime_s: int = 86_400  # vouchers expiring later are refused (seconds)
    max_key_lifetime_s: int = 90 * 86_400  # payment keys expiring later are refused (seconds)
    chain_reads: int = 8  # EVM reads at once for payment checks (more wait; see escrow_reads)
    chain_read_queue: int = 256  # reads that may wait; beyond it a request gets 503 chain_busy
    # dial registered node endpoints on non-public addresses too (devnet, LAN); by default the
    # router applies the nodes' public-address policy (router.py)
    private_endpoints: bool = False
    # the credits a hosted gateway pays charging nodes with (None: `<wallet>-credits.json`)
    credits: Path | None = None
    min_credit_positions: int = MIN_CREDIT_POSITIONS  # never pay a credit per fewer positions
    top_up_below: int = TOP_UP_BELOW  # buy credits when the wallet holds fewer (credits)
    top_up: int = TOP_UP  # credits bought per top-up (0: never buy; `planet credits buy` by hand)
    # every validator's CometBFT RPC, to buy credits from (each signs its own share; empty:
    # committee_rpc alone, enough only for a committee where it holds 2/3 of the power)
    validator_rpcs: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    # the activations' dtype in the raw frames sent to the nodes (`--wire-dtype`): float16 by
    # default (half the bytes, activations rounded at every hop), float32 for exact activations
    wire_dtype: str = WIRE_DTYPE
    # the other models served, after `manifest` (`--manifest` again): a question names its
    # model (node/gateway/models.py), each model has its own client part and router
    more_manifests: tuple[Path, ...] = ()

    @property
    def manifests(self) -> tuple[Path, ...]:
        """Every served model's manifest, the first (the default) first."""
        return (self.manifest, *self.more_manifests)

    def validate(self) -> GatewayConfig:
        if not 0 < self.price_wei_per_token < 1 << 64:
            raise UsageError("--price-wei-per-token must be between 1 and 2^64-1")
        if not 0 < self.max_sessions_per_node <= 4096:
            raise UsageError("--max-sessions-per-node must be 1..4096")
        if not 0 < self.report_min_questions <= 1024:
            raise UsageError("--report-min-questions must be 1..1024")
        if not 0 < self.report_max_wait_s <= 86_400:
            raise UsageError("--report-max-wait must be 0 < seconds <= 86400")
        if self.refund_margin_s is not None and not 0 <= self.refund_margin_s <= 30 * 86_400:
            raise UsageError("--refund-margin-s must be 0..2592000 seconds")
        if not 1 <= self.attempts <= 20:
            raise UsageError("--failover-attempts must be 1..20")
        if not 0.5 <= self.stall_s <= 600:
            raise UsageError("--stall-s must be 0.5..600 seconds")
        if not 0 <= self.node_cooldown_s <= 3_600:
            raise UsageError("--node-cooldown-s must be 0..3600 seconds")
        if not 0 <= self.speculate <= 16:
            raise UsageError("--speculate must be 0..16 guesses per pass")
        if self.ring and self.speculate:
            raise UsageError(
                "--ring and --speculate are two ways past the round trips; pick one",
                hint="over relays, --ring (the first node's loop) saves the most",
            )
        if not 0 < self.report_every_s <= 3_600:
            raise UsageError("the reporter's pass interval must be 0 < seconds <= 3600")
        if not 0 < self.committee_block_s <= 600:
            raise UsageError("--committee-block-s must be 0 < seconds <= 600")
        if not 0 < self.max_key_lifetime_s <= 10 * 365 * 86_400:
            raise UsageError("--max-key-lifetime-s must be 1 .. 10 years in seconds")
        if not 0 < self.chain_reads <= 256 or not 0 <= self.chain_read_queue <= 65_536:
            raise UsageError("chain reads: 1..256 at once, 0..65536 waiting")
        if self.min_credit_positions < 1:
            raise UsageError("--min-credit-positions must be >= 1")
        if not 0 <= self.top_up <= MAX_TOP_UP:
            raise UsageError(
                f"--top-up must be 0 (never buy) .. {MAX_TOP_UP} credits, got {self.top_up}"
            )
        if not 0 <= self.top_up_below <= 10 * MAX_TOP_UP:
            raise UsageError(
                f"--top-up-below must be 0 .. {10 * MAX_TOP_UP} credits, got {self.top_up_below}"
            )
        if self.top_up and not self.top_up_below:
            raise UsageError(
                "--top-up-below 0 never buys",
                hint="give the low-water mark in credits, or turn buying off with --top-up 0",
            )
        if self.wire_dtype not in WIRE_DTYPES:
            raise UsageError(
                f"--wire-dtype must be one of {', '.join(WIRE_DTYPES)}, got {self.wire_dtype!r}"
            )
        if not 0 < self.port < 65536:
            raise UsageError(f"--port must be 1..65535, got {self.port}")
        for manifest in self.manifests:
            if not manifest.exists():
                raise UsageError(
                    f"no manifest at {manifest}",
                    hint="prepare the model first: planet model prepare --parts 3",
                )
        if len({m.resolve() for m in self.manifests}) != len(self.manifests):
            raise UsageError(
                "the same --manifest is given twice", hint="give each model's manifest once"
            )
        if not self.deployment.exists():
            raise UsageError(
                f"no deployment file at {self.deployment}",
                hint="deploy the contracts first: planet contracts deploy",
            )
        return self

    @property
    def receipts_path(self) -> Path:
        return self.receipts or self.wallet.with_name(self.wallet.stem + "-receipts.jsonl")

    @property
    def credits_path(self) -> Path:
        return self.credits or self.wallet.with_name(self.wallet.stem + "-credits.json")

    @property
    def credit_rpcs(self) -> tuple[str, ...]:
        """The validators credits are bought from (`validator_rpcs`, else the committee RPC)."""
        return self.validator_rpcs or (self.committee_rpc,)
