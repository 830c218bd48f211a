"""The compute node's configuration: one frozen dataclass, validated once at start."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from node.server.next_hops import FORWARD_NONE, NextHopSpec
from node.server.rendezvous import RendezvousRelay
from protocol.errors import ConfigError
from protocol.spans import MAX_SPAN, ShardSpan


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything `planet node serve` needs. Units are in the field names."""

    manifest_path: Path
    shard_id: int  # the shard served, or the first shard of a span
    # the last shard of a span served as one hop (`--shards A-B`, protocol/spans.py); None: the
    # node serves `shard_id` alone
    last_shard: int | None = None
    host: str = "127.0.0.1"
    port: int = 18100
    device: str = "auto"
    # sessions idle longer than this are evicted (their KV cache freed)
    idle_timeout_s: float = 300.0
    # how often the evictor looks for idle sessions
    evict_interval_s: float = 15.0
    # at most this many open sessions; more → 503 busy
    max_sessions: int = 64
    # at most this much KV cache over all sessions; more → 503 busy
    max_cache_bytes: int = 2 * 1024**3
    # per-caller caps (a caller is a peer address, an IPv6 /64; see node/server/peers.py) are
    # clamped to the node-wide caps above
    # one caller holds at most this many sessions; more → 429 busy
    max_sessions_per_peer: int = 16
    # one caller holds at most this much KV cache over its sessions; more → 429 busy
    max_cache_bytes_per_peer: int = 512 * 1024**2
    # one caller has at most this many sessions with frames in flight (a session holds
    # ≤ MAX_SESSION_FRAMES); more → busy
    max_inflight_per_peer: int = 16
    # a session older than this is evicted even if it is used (its client starts over)
    max_session_age_s: float = 3600.0
    # when the node is full, a session idle this long may be reclaimed for another caller
    # from the caller that holds the most
    reclaim_idle_s: float = 30.0
    # largest message accepted on a link (a frame); more closes the link (1009 message too big)
    max_request_bytes: int = 32 * 1024**2
    # most positions per frame (prefill chunk)
    max_tokens_per_frame: int = 4096
    # most sessions whose decode steps run as one batched forward
    max_batch: int = 32
    # most frames waiting for the forward worker (all callers); more → 503 busy
    max_queued: int = 256
    # KV of prompt prefixes kept for other sessions' prefills (node/server/prefix_cache.py),
    # over all of them, least recently used dropped first; 0: no prefix cache
    prefix_cache_bytes: int = 128 * 1024**2
    # a cached block's route keys are advertised (/info prefix_routes) once this many sessions
    # reached it: 2 keeps a prompt only one session sent out of the summary (docs/privacy.md)
    prefix_advertise_min_sessions: int = 2
    # torch intra-op threads for the forward pass (0 = half the cores, 1 to 4)
    torch_threads: int = 0
    # record fingerprints of served blocks and spool their commit records here for the node
    # agent (docs/verification.md §2); None: record nothing
    commit_dir: Path | None = None
    # inputs + fingerprints kept for spot-check tickets, over all sessions (oldest dropped)
    served_max_bytes: int = 256 * 1024**2
    # a session idle this long gets its partial last block recorded (then no more positions);
    # None: only once the session leaves the node (closed, idle-evicted, aged out), so a client
    # that pauses never loses the credit for what follows
    served_seal_idle_s: float | None = None
    # spot-check tickets (node.server.tickets.enable_tickets): the committee RPC whose epoch
    # records authorize ticket requests, and the selection rate both sides use
    committee_rpc: str | None = None
    spot_check_ppm: int = 50_000
    # which next hops a circuit's `open` may make this node dial (node/server/next_hops.py):
    # none (default), a URL list, committee (needs committee_rpc) or any (development only)
    next_hops: NextHopSpec = FORWARD_NONE
    # explicit local mode (`--plaintext-links`): serve plain http/ws instead of TLS bound to the
    # node key, and dial http:// next hops anywhere (else only on loopback; protocol/links.py)
    plaintext_links: bool = False
    # shard chunks served to joining nodes (node/server/shards.py): bytes per second one
    # caller may fetch (a token bucket), and chunk requests at once per caller / node-wide
    chunk_bytes_per_s_per_peer: int = 32 * 1024**2
    max_chunk_requests_per_peer: int = 4
    max_chunk_requests: int = 16
    # paid work (node/server/payments.py): positions one credit pays for, per session (0: the
    # node computes without credits); the credits taken are spooled to `credits_dir` for the
    # node agent to redeem (needs committee_rpc, whose keys and spent set they are checked
    # against); a frame past what is paid waits this long for the `pay` on its way
    credit_positions: int = 0
    credits_dir: Path | None = None
    pay_wait_s: float = 5.0
    # blocks: a credit is taken only while the chain will still redeem it this many blocks after
    # its latest committed height (the node's redemption delay; protocol/credits.py `takeable`)
    credit_margin_blocks: int = 60  # protocol/credits.py NODE_MARGIN_BLOCKS
    # credits per session served on while their locks are in flight (node/server/credit_locks.py):
    # what a client that shows one credit to several nodes gets from each node that loses it
    credit_unlocked: int = 1
    # relays that front this node behind NAT (node/server/rendezvous.py): it keeps a link to
    # each and serves the connections that reach its port there; empty: none
    rendezvous: tuple[RendezvousRelay, ...] = ()

    @property
    def span(self) -> ShardSpan:
        """The shards served as one hop (one shard: `shard_id` alone)."""
        last = self.shard_id if self.last_shard is None else self.last_shard
        return ShardSpan(self.shard_id, last)

    def validate(self) -> ServerConfig:
        problems = []
        if self.shard_id < 0:
            problems.append("shard must be >= 0")
        if self.last_shard is not None and not (
            self.shard_id <= self.last_shard <= self.shard_id + MAX_SPAN - 1
        ):
            problems.append(f"a span's last shard must be first … first + {MAX_SPAN - 1}")
        if not 0 <= self.port <= 65535:
            problems.append("port must be in 0..65535")
        if self.idle_timeout_s <= 0:
            problems.append("idle timeout must be > 0 seconds")
        if self.evict_interval_s <= 0:
            problems.append("evict interval must be > 0 seconds")
        if self.max_sessions < 1:
            problems.append("max sessions must be >= 1")
        if self.max_cache_bytes < 1:
            problems.append("max cache must be > 0 bytes")
        if self.max_sessions_per_peer < 1:
            problems.append("max sessions per peer must be >= 1")
        if self.max_cache_bytes_per_peer < 1:
            problems.append("max cache per peer must be > 0 bytes")
        if self.max_inflight_per_peer < 1:
            problems.append("max in-flight frames per peer must be >= 1")
        if self.max_session_age_s <= 0:
            problems.append("max session age must be > 0 seconds")
        if self.reclaim_idle_s < 0:
            problems.append("reclaim idle time must be >= 0 seconds")
        if self.max_request_bytes < 1024:
            problems.append("max request size must be >= 1 KiB")
        if self.max_tokens_per_frame < 1:
            problems.append("max tokens per frame must be >= 1")
        if self.max_batch < 1:
            problems.append("max batch must be >= 1")
        if self.max_queued < 1:
            problems.append("max queued frames must be >= 1")
        if self.prefix_advertise_min_sessions < 1:
            problems.append("prefix routes need >= 1 session per advertised block")
        if self.prefix_cache_bytes < 0:
            problems.append("prefix cache must be >= 0 bytes (0: none)")
        if self.torch_threads < 0:
            problems.append("torch threads must be >= 0")
        if not 0 <= self.spot_check_ppm <= 1_000_000:
            problems.append("spot-check rate must be 0 … 1 000 000 ppm")
        if self.served_max_bytes < 1:
            problems.append("served-work memory cap must be > 0 bytes")
        if self.served_seal_idle_s is not None and not self.served_seal_idle_s > 0:
            problems.append("served seal idle time must be > 0 seconds")
        if self.chunk_bytes_per_s_per_peer < 1:
            problems.append("chunk rate per peer must be > 0 bytes/s")
        if not 1 <= self.max_chunk_requests_per_peer <= self.max_chunk_requests:
            problems.append("chunk requests per peer must be 1 … the node-wide cap")
        if self.next_hops.mode == "committee" and not self.committee_rpc:
            problems.append("next hops from the committee need a committee RPC")
        if self.next_hops.mode == "list" and not self.next_hops.urls:
            problems.append("a next-hop list needs at least one URL")
        if self.credit_positions < 0:
            problems.append("positions per credit must be >= 0 (0: no credits asked)")
        if self.credit_positions and not (self.committee_rpc and self.credits_dir):
            problems.append("a node paid with credits needs a committee RPC and a credits dir")
        if not self.pay_wait_s > 0:
            problems.append("pay wait must be > 0 seconds")
        if not 1 <= self.credit_margin_blocks <= 1_000_000:
            problems.append("the credit margin must be 1 … 1,000,000 blocks")
        if not 0 <= self.credit_unlocked <= 64:
            problems.append("credits served on before their locks must be 0 … 64")
        if problems:
            raise ConfigError("invalid node config: " + "; ".join(problems))
        return self
