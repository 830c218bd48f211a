"""Thin ABCI 2.0 adapters: protobuf requests in, `State` calls, protobuf responses out.

Nothing here decides anything the chain agrees on; it converts between CometBFT's messages and
the pure state machine (`machine.py`), and reads the validator's local reputation scores for
ExtendVote from `<home>/reputation_scores.json`, and signs paid mints with the validator's
credit key shares in `<home>/credit_shares/` (`/credit_partials`, abci_app/threshold_queries.py).
Scores file:

    {"epoch": 3, "scores": {"<node key hex>": 812345, ...}, "invalid": ["<node key hex>"],
     "speeds": {"<node key hex>": 42, ...}}

`scores`: C(T) at 10**6 per node; `invalid`: nodes that did not answer their challenge (or
answered with a bad signature); `speeds`: measured decode speeds (tokens/s) of scored nodes
(protocol/speeds.py); `epoch`, `invalid` and `speeds` are optional. A file written for epoch e
is this validator's report at the closes of e … e + SCORES_MAX_AGE_EPOCHS (its latest
measurement: a verifier may need more than one epoch per challenge), older or later ones give
none. A missing or invalid file yields an empty report (logged), never a failed vote.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from abci_app import extensions
from abci_app.codes import CODESPACE, Code
from abci_app.machine import StateMachine, TxResult
from abci_app.proto import abci_pb
from abci_app.queries import query as run_query
from abci_app.threshold_queries import PARTIALS_PATH, partials
from protocol.canonical import JsonInputError, parse_json
from protocol.credit_shares import CREDIT_SHARES_DIR, CreditShareStore
from protocol.errors import ProtocolError
from protocol.fields import is_int

log = logging.getLogger(__name__)

APP_VERSION = 1
SCORES_FILE = "reputation_scores.json"
MAX_SCORES_FILE_BYTES = 4 * 1024 * 1024
# A verifier's latest scores stay its report for this many epochs after the one they were
# measured in: a challenge may take longer than an epoch (a busy verifier, short epochs), and
# the chain agrees a node's C only from ≥ 2/3 of the power reporting it at the same close.
SCORES_MAX_AGE_EPOCHS = 3
MAX_LOG_CHARS = 512


def safe_log(text: str) -> str:
    """A result log CometBFT can carry: bounded, and encodable as UTF-8 (no lone surrogates)."""
    return text[:MAX_LOG_CHARS].encode("utf-8", "backslashreplace").decode("utf-8")


pb = abci_pb()


# Events CometBFT's tx indexer should index (searchable with tx_search). The per-tx
# bookkeeping events of the busy tx types (planet.tx, planet.commit, planet.reveal) are not
# indexed: indexing every attribute of every tx costs CometBFT real CPU under load.
INDEXED_EVENTS = frozenset(
    {
        "planet.node",
        "planet.stake",
        "planet.evidence",
        "planet.verdict",
        "planet.payout",
    }
)


def _events(result: TxResult) -> list[Any]:
    return [
        pb.Event(
            type=kind,
            attributes=[
                pb.EventAttribute(key=k, value=v, index=kind in INDEXED_EVENTS)
                for k, v in attributes
            ],
        )
        for kind, attributes in result.events
    ]


class CommitteeApp:
    """The ABCI application: one per process, shared by CometBFT's four connections."""

    def __init__(self, machine: StateMachine, home: Path | None = None) -> None:
        self.machine = machine
        self.state = machine.state
        self.home = home
        self.credit_shares = CreditShareStore((home or Path(".")) / CREDIT_SHARES_DIR)
        self.local_routes = {
            PARTIALS_PATH: lambda state, params: partials(state, self.credit_shares, params),
        }
        self.handlers: dict[str, Callable[[Any], Any]] = {
            "echo": lambda r: pb.ResponseEcho(message=r.message),
            "flush": lambda r: pb.ResponseFlush(),
            "info": self.info,
            "init_chain": self.init_chain,
            "query": self.query,
            "check_tx": self.check_tx,
            "commit": self.commit,
            "list_snapshots": lambda r: pb.ResponseListSnapshots(),
            "offer_snapshot": lambda r: pb.ResponseOfferSnapshot(
                result=pb.ResponseOfferSnapshot.REJECT
            ),
            "load_snapshot_chunk": lambda r: pb.ResponseLoadSnapshotChunk(),
            "apply_snapshot_chunk": lambda r: pb.ResponseApplySnapshotChunk(
                result=pb.ResponseApplySnapshotChunk.ABORT
            ),
            "prepare_proposal": self.prepare_proposal,
            "process_proposal": self.process_proposal,
            "extend_vote": self.extend_vote,
            "verify_vote_extension": self.verify_vote_extension,
            "finalize_block": self.finalize_block,
        }

    def handle(self, request: Any) -> Any:
        """One Request → one Response (both `tendermint.abci` protobuf messages)."""
        method = request.WhichOneof("value")
        if method is None:
            return pb.Response(exception=pb.ResponseException(error="empty request"))
        response = self.handlers[method](getattr(request, method))
        return pb.Response(**{method: response})

    # --- info and genesis ---------------------------------------------------------------------

    def info(self, req: Any) -> Any:
        return pb.ResponseInfo(
            data="planet-committee",
            version="0.1.0",
            app_version=APP_VERSION,
            last_block_height=self.state.height,
            last_block_app_hash=self.state.app_hash,
        )

    def init_chain(self, req: Any) -> Any:
        validators = []
        for update in req.validators:
            kind = update.pub_key.WhichOneof("sum")
            if kind != "ed25519":
                raise ProtocolError(f"validator key type {kind} is not supported (ed25519 only)")
            validators.append((update.pub_key.ed25519, update.power))
        enable = req.consensus_params.abci.vote_extensions_enable_height
        app_hash = self.machine.init_chain(req.chain_id, validators, req.app_state_bytes, enable)
        return pb.ResponseInitChain(app_hash=app_hash)

    # --- mempool ------------------------------------------------------------------------------

    def check_tx(self, req: Any) -> Any:
        try:
            result = self.machine.check_tx(req.tx)
        except Exception:  # CheckTx decides nothing the chain agrees on: a bug must not halt
            log.exception("check_tx failed on %d bytes", len(req.tx))
            result = TxResult(Code.INTERNAL, "internal error while checking the tx")
        return pb.ResponseCheckTx(
            code=result.code, log=safe_log(result.log), codespace=_space(result.code), gas_wanted=1
        )

    # --- proposals and vote extensions --------------------------------------------------------

    def prepare_proposal(self, req: Any) -> Any:
        vx = None
        if self.machine.vx_required(req.height):
            commit = req.local_last_commit
            local = extensions.ExtendedCommit(
                height=req.height - 1,
                round=commit.round,
                votes=tuple(
                    extensions.ExtVote(
                        address=vote.validator.address.hex().upper(),
                        power=vote.validator.power,
                        extension=vote.vote_extension,
                        signature=vote.extension_signature,
                        flag=vote.block_id_flag,
                    )
                    for vote in commit.votes
                ),
            )
            vx = extensions.without_invalid_extensions(
                local,
                self.state.chain_id,
                self.state.validator_keys(),
                self.state.genesis.epoch_length,
            ).encode()
        txs = self.machine.prepare_proposal(req.height, list(req.txs), req.max_tx_bytes, vx)
        return pb.ResponsePrepareProposal(txs=txs)

    def process_proposal(self, req: Any) -> Any:
        ok, reason = self.machine.process_proposal(req.height, list(req.txs))
        if not ok:
            log.warning(
                "process_proposal rejected height=%d reason=%s", req.height, safe_log(reason)[:200]
            )
        status = pb.ResponseProcessProposal.ACCEPT if ok else pb.ResponseProcessProposal.REJECT
        return pb.ResponseProcessProposal(status=status)

    def extend_vote(self, req: Any) -> Any:
        length = self.state.genesis.epoch_length
        if req.height < 1 or req.height % length != 0:
            return pb.ResponseExtendVote(vote_extension=b"")
        epoch = req.height // length
        report = self._local_report(epoch)
        extension = extensions.encode_extension(epoch, report.scores, report.invalid, report.speeds)
        return pb.ResponseExtendVote(vote_extension=extension)

    def _local_report(self, epoch: int) -> extensions.Report:
        if self.home is None:
            return extensions.EMPTY_REPORT
        path = self.home / SCORES_FILE
        if not path.exists():
            return extensions.EMPTY_REPORT
        try:
            with path.open("rb") as handle:
                raw = handle.read(MAX_SCORES_FILE_BYTES + 1)
            doc = parse_json(raw, max_bytes=MAX_SCORES_FILE_BYTES, max_depth=2)
            if not isinstance(doc, dict):
                raise extensions.VoteExtensionError("expected an object")
            written = doc.get("epoch", epoch)
            if not is_int(written, max(0, epoch - SCORES_MAX_AGE_EPOCHS), epoch):
                log.info(
                    "scores file is for epoch %s, not %d-%d: extending with none",
                    ascii(written)[:40],
                    epoch - SCORES_MAX_AGE_EPOCHS,
                    epoch,
                )
                return extensions.EMPTY_REPORT
            invalid = doc.get("invalid", [])
            if isinstance(invalid, list) and all(isinstance(i, str) for i in invalid):
                invalid = sorted(set(invalid))
            return extensions.parse_report(doc.get("scores", {}), invalid, doc.get("speeds"))
        except (OSError, JsonInputError, extensions.VoteExtensionError) as error:
            log.warning("ignoring invalid %s: %s", path, error)
            return extensions.EMPTY_REPORT

    def verify_vote_extension(self, req: Any) -> Any:
        try:
            extensions.parse_extension(
                req.vote_extension, req.height, self.state.genesis.epoch_length
            )
        except extensions.VoteExtensionError as error:
            log.warning(
                "vote extension rejected height=%d validator=%s reason=%s",
                req.height,
                req.validator_address.hex().upper()[:80],
                safe_log(error.message)[:200],
            )
            return pb.ResponseVerifyVoteExtension(status=pb.ResponseVerifyVoteExtension.REJECT)
        return pb.ResponseVerifyVoteExtension(status=pb.ResponseVerifyVoteExtension.ACCEPT)

    # --- blocks -------------------------------------------------------------------------------

    def finalize_block(self, req: Any) -> Any:
        machine = self.machine
        machine.begin_block(req.height, req.hash, req.time.seconds)
        results = []
        for index, tx in enumerate(req.txs):
            result = machine.deliver_tx(tx, index)
            results.append(
                pb.ExecTxResult(
                    code=result.code,
                    log=safe_log(result.log),
                    codespace=_space(result.code),
                    events=_events(result),
                    gas_wanted=1,
                    gas_used=1,
                )
            )
        app_hash = machine.end_block()
        updates = []
        for pub_key, power in self.state.validator_updates:
            update = pb.ValidatorUpdate(power=power)
            update.pub_key.ed25519 = bytes.fromhex(pub_key)
            updates.append(update)
        return pb.ResponseFinalizeBlock(
            tx_results=results, app_hash=app_hash, validator_updates=updates
        )

    def commit(self, req: Any) -> Any:
        self.machine.commit()
        return pb.ResponseCommit(retain_height=0)

    def query(self, req: Any) -> Any:
        try:
            code, value, message = run_query(self.state, req.path, req.data, self.local_routes)
        except Exception:  # a query reads committed state only: a bug must not stop the node
            log.exception("query failed path=%s", ascii(req.path)[:200])
            code, value, message = Code.INTERNAL, b"", "internal error while answering the query"
        return pb.ResponseQuery(
            code=code,
            value=value,
            log=safe_log(message),
            height=self.state.height,
            codespace=_space(code),
        )


def _space(code: int) -> str:
    return "" if code == Code.OK else CODESPACE
