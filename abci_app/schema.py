"""The committee chain's key-value schema: every namespace named once, with what it holds.

State is a set of entries (namespace, key) → JSON value (integers, strings, lists, objects; no
floats). Keys that carry an epoch spell it as 12 zero-padded digits (`epoch_key`) so that a
range read returns one epoch's entries in order; `epoch_range(e)` is that range. The value
shapes are part of the app hash and of the query answers: docs/committee.md "State".

Node lifecycle values (`node/<key>.status`) live here too: the registry writes them, the epoch,
settlement and query rules read them.
"""

from __future__ import annotations

# --- chain metadata and accounts -----------------------------------------------------------------

# meta/{chain_id, ve_enable_height, genesis, validators} (InitChain) and meta/current_epoch;
# meta/validators_next: {from_height, validators} the set an epoch boundary's approved changes
# make, in effect from that height (validator_set.py)
META = "meta"
# acct/<signer hex>: the signer's last committed nonce (int)
NONCE = "acct"

# --- the node registry (registry.py) -------------------------------------------------------------

# node/<node key hex>: {key, evm_address, role, model, shards, endpoint, capacity, status,
# status_height, registered_height, last_heartbeat}
NODE = "node"
# evm/<lowercase EVM address>: the node key that address is bound to
EVM_BINDING = "evm"
# stake/<node key>: {attestations: {validator address: wei}, agreed: wei or null, height}
STAKE = "stake"
# rep/<node key>: {r, window, epochs, last_epoch} (protocol/reputation.py)
REPUTATION = "rep"
# speed/<node key hex>: {speed, epoch, reports {validator address: [epoch, tokens/s]}}: the
# node's measured decode speed, the lower median of the latest report of each distinct verifier
# within `retention_epochs` (abci_app/speeds.py)
SPEED = "speed"
# pool/<model>/<node key hex>: 1 for each compute node of the model that is staked (agreed
# stake ≥ min_stake.compute) and has not left: the only nodes that can be routable, so
# /pool_health counts a pool from these alone, never from the free registrations (registry.py
# `update_pool`: kept at attest_stake, leave and expiry)
POOL = "pool"
# hbdue/<height>: node keys that are overdue at that height unless they sent a heartbeat since
HEARTBEAT_DUE = "hbdue"
# regdue/<height>: node keys whose registration expires at that height unless staked by then
REGISTRATION_DUE = "regdue"

# relay/<node key>: {endpoint, relay_key}, the overlay relays among the registered keys (role
# relay in node/<key>; registry.py, relay_queries.py); relaykey/<X25519 key hex> and
# relayurl/<endpoint>: the relay's node key, so no two relays share either (released when the
# relay leaves or expires)
RELAY = "relay"
RELAY_BY_KEY = "relaykey"
RELAY_BY_URL = "relayurl"

# node/<key>.status; EXPIRED is only the status of the planet.node event of an expired node
JOIN, SERVING, DOWN, LEFT = "JOIN", "SERVING", "DOWN", "LEFT"
EXPIRED = "EXPIRED"

# --- commit-reveal, evidence, verdicts (commitments.py, verdicts.py) -----------------------------

# commit/<node>/<session>/<step>/<shard>: {commitment, height[, output_hash, salt,
# revealed_height, match]}
COMMITMENT = "commit"
# evidence/<0x sha256 of the record>: an equivocation or a reveal mismatch
EVIDENCE = "evidence"
# verdict/<0x struct hash>: a Verdict's fields, votes, power, confirmed[, settled]
VERDICT = "verdict"
# vdue/<epoch>: ids of the verdicts whose accusation is settled when that epoch closes
VERDICT_DUE = "vdue"
# vrep/<validator address>: {confirmed, refused, unconfirmed, last_epoch, benched_until}, the
# validator's accusation marks and the last epoch its verifier is benched for false accusations
VERIFIER_RECORD = "vrep"
# vnum/<validator address>: {numerics, numerics_epoch[, numerics_previous][, numerics_next
# {numerics, epoch}]}: the numerics version the validator's verifier runs, as the node record
# holds a node's (numerics.py); counted in its version's spot-check quorum
VERIFIER_NUMERICS = "vnum"
# numdue/<epoch>: {nodes: [node keys], verifiers: [validator addresses]} whose numerics change
# takes effect when that epoch opens (applied and deleted at the boundary)
NUMERICS_DUE = "numdue"
# vconv/<lowercase account>: the last epoch a verdict against that account was confirmed
CONVICTED = "vconv"
# vacc/<lowercase account>: {epoch: [validator addresses]}, who voted any verdict against the
# account in each of its last ACCUSED_EPOCHS epochs (whether the committee accused it at all)
ACCUSERS = "vacc"
# slashed/<epoch>/<lowercase account>: [offences], verdicts against the account confirmed in
# that epoch, so it earns nothing then and is not slashed twice for one offence (deleted when
# the epoch closes)
SLASHED = "slashed"

# --- epochs, verifier seeds, spot checks (epochs.py, seeds.py, spot_reports.py) ------------------

# epoch/<e, plain decimal>: {epoch, start_height, end_height, seed, leader, challenges,
# verifiers, reputation_applied}
EPOCH = "epoch"
# seed/<epoch>/<validator key>: {epoch, validator, commitment, height, seed, revealed_height}
SEED = "seed"
# vurl/<validator key>: {url, validator, height}, where its verifier forwards its findings
VERIFIER_ENDPOINT = "vurl"
# spotrep/<epoch checked>/<validator key>: {count, height}
SPOT_REPORT = "spotrep"
# vwork/<epoch credited>/<lowercase operator>: spot checks credited to that operator then
SPOT_CREDIT = "vwork"

# --- settlement (settlement.py) ------------------------------------------------------------------

# squery/<query id>/<gateway>: {fee, height, gateway}, reported by the gateway key bound to
# `gateway` (paid to it, if the deposit names it: the escrow's page rule) and not yet settled
PENDING_QUERY = "squery"
# sqdone/<query id>/<gateway>: {fee, statement}: the statement number whose payout root settled it
SETTLED_QUERY = "sqdone"
# spent/<payer>/<gateway>/<kind>/<id>: {total, expiry}: the cumulative wei charged under a
# payer-signed authorization (kind "voucher" | "key"), kept until its expiry (replay guard)
SPENT = "spent"
# cpend/<payer>/<gateway>/<kind>/<id>: {from, total, height}: the part of an authorization's
# total (total − from) not yet debited in a payout statement, first reported at `height`
PENDING_CHARGE = "cpend"
# credit/<epoch>/<account>/<shard, 5 digits>/<model>: {account, model, shard, credits,
# layer_tokens[, carried]}, what a node redeemed in that epoch (node_payouts.py; `carried`: the
# credits moved in from the epoch before, which paid nothing; they move no further)
CREDIT = "credit"
# payout/<epoch>[/<page, 4 digits>]: a payout statement (page 0 has no page part), its charges,
# rows, shares (page 0), votes, confirmed
PAYOUT = "payout"

# --- gateway bindings (gateway_bindings.py) -------------------------------------------------------

# gwaddr/<lowercase address>: {key, bound, nonce, height}: the address's latest binding (kept
# after a release: its nonce is the replay guard)
GATEWAY_ADDRESS = "gwaddr"
# gwkey/<gateway key>: {address, nonce, height} while the key is bound
GATEWAY_KEY = "gwkey"

# --- commitment coverage (coverage.py) -----------------------------------------------------------

# cover/<node>/<shard, 5 digits>: {committed, charged, free, bought, slack (positions), marks
# [[epoch, bought, charged + slack, charged at its close]], recent [[epoch, records, consumed
# positions, sessions begun]], uncommitted_since (epoch or null)}: what a node committed against
# what credits bought from it (coverage.py)
COVERAGE = "cover"
# covdue/<node>: 1 for each node that left the staked pools (stake below min_stake.compute, or
# `leave`) since the last epoch close: that close still judges its cover entries once, so what it
# committed while staked is settled; the close deletes the index (coverage.py `close`)
COVERAGE_DUE = "covdue"

# --- credits (credits.py) --------------------------------------------------------------------

# vchange/<change id>: {id, action, pub_key, address, power, operator, proposer, height,
# last_epoch, approvals [validator addresses], approved_height}: a pending validator set change;
# vchprop/<proposer address> and vchkey/<target pub_key>: its id (one pending change each)
VALIDATOR_CHANGE = "vchange"
VALIDATOR_CHANGE_BY_PROPOSER = "vchprop"
VALIDATOR_CHANGE_BY_KEY = "vchkey"
# cdkg/<period>: {period, session, receivers [[address, pub_key]], threshold, start, finish,
# result: null | {key, commitments, public_shares {address: hex}, qualified, threshold} |
# {failed: reason}}: one key period's DKG and its committee key (credit_dkg.py)
CREDIT_DKG = "cdkg"
# cdkgm/<period>/d/<dealer, 5 digits>: the deal's canonical bytes (hex);
# cdkgm/<period>/c/<dealer>/<receiver>: 0, a complaint; cdkgm/<period>/j/<dealer>/<receiver>: the
# revealed share (hex). Kept with the run: a receiver that was offline opens its deals later.
# Both pruned once the period's credits are past their window (issue epoch + lifetime)
CREDIT_DKG_MESSAGE = "cdkgm"
# cbuyer/<period>/<payer>: the height of the payer's first funded mint of that key period;
# cbuyers/<period>: how many distinct payers bought credits of it (its anonymity set)
CREDIT_PERIOD_BUYER = "cbuyer"
CREDIT_PERIOD_BUYERS = "cbuyers"
# mint/<mint id>: {epoch, payer, count, amount, expiry, period, issue_epoch, points, height,
# vouched [validator addresses], funded_height (null until vouched by ≥ 2/3 of the power)};
# validators sign its points with their key share when asked (/credit_partials), once funded;
# pruned with its epoch while unfunded, with issue_epoch + credits.lifetime_epochs once funded
MINT = "mint"
# mpart/<mint id>/<validator address>: {index, partials [hex], height}: a validator's partial
# signatures for a funded mint, verified when posted (mint_partials.py); pruned with the mint
MINT_PARTIALS = "mpart"
# msign/<deadline height, 20 digits>/<mint id>: {payer, amount, count, issue_epoch} for a funded
# mint with fewer than t posted partial sets (what its refund pays, kept here: the record may be
# pruned first); deleted when the t-th lands, or at the deadline's EndBlock (then refunded)
MINT_SIGNING = "msign"
# mrefund/<epoch>/<mint id>: {payer, amount}: a mint refunded in that epoch (fewer than t partial
# sets by its deadline): paid to its payer in full by that epoch's close (settlement.py), moved
# to the next epoch while the close cannot pay it in full; deleted once paid
MINT_REFUND = "mrefund"
# mpend/<lane>/<mint id>: 0 while the mint waits for its funding (the watchers' work list,
# paged in key order): lane "0" when its payer had a funded mint before (`mbuyer/`: a paying
# customer), "1" for a payer new to the chain, so no number of strangers' mints can list before
# a returning buyer's
MINT_UNFUNDED = "mpend"
BUYER_LANE, NEW_PAYER_LANE = "0", "1"
# mpay/<payer>/<mint id>: 0 for each mint of a payer (what the watchers count against a balance)
MINT_BY_PAYER = "mpay"
# mpp/<payer>/<epoch>: how many of the payer's mints of that epoch wait for their funding (int,
# deleted at 0, pruned with the epoch): what bounds a payer's unfunded mints (genesis
# `credits.max_pending_mints`; only the epochs still fundable are read)
MINT_PAYER_PENDING = "mpp"
# mbuyer/<payer>: the height of the payer's last funded mint (not pruned: one entry per payer that
# ever paid for a credit)
MINT_BUYER = "mbuyer"
# cspent/<sha256 of the credit nonce>: the height that redeemed it (the double-spend guard)
CREDIT_SPENT = "cspent"
# clock/<sha256 of the credit nonce>: {node, height}: the compute node the credit pays, locked
# before it served (credit_locks.py); pruned with the credit's window, like `cspent/`
CREDIT_LOCK = "clock"
# rcredit/<relay key>/<epoch>: {account, credits}: what a relay redeemed in the epoch
# (relay_credits.py); pruned once the epoch is settled and retained
RELAY_CREDIT = "rcredit"
# rpay/<epoch>/<relay's lowercase EVM address>: {account, credits[, carried]}: what relays
# redeemed in the epoch, to be paid at its close at the credit's price (settlement.py; deleted
# by that close; `carried`: the part moved in from the epoch before, which paid nothing)
RELAY_PAY = "rpay"
# cissue/<credit epoch>: {funded, redeemed}: how many credits of that epoch funded mints bought
# and nodes redeemed; deleted at the close of epoch + lifetime (the rest expired: their price
# stays in the credit pool, its reserve)
CREDIT_ISSUED = "cissue"
# cdue/<epoch>: wei (decimal string) the credit pool owes the workers of that epoch: the price of
# the credits redeemed in it and what was due before and not drawn (settlement.py draws it)
CREDIT_DUE = "cdue"
# cpool/balance: wei (decimal string) in the escrow's credit pool as the committee counts it:
# the purchases its statements listed, less the draws they listed
CREDIT_POOL = "cpool"
POOL_BALANCE = "balance"

# --- retention (retention.py, rules.track*) ------------------------------------------------------

# gc/<epoch>/<ns>/<key>: delete ns/key once that epoch is settled and past retention
PRUNE_INDEX = "gc"
# gcexp/<unix time, 20 digits>/<ns>/<key>: delete ns/key once block time is past that time
EXPIRY_INDEX = "gcexp"


def signing_key(deadline: int, mint: str) -> str:
    return f"{deadline:020d}/{mint}"


def epoch_key(epoch: int) -> str:
    """An epoch as the leading part of a key: 12 zero-padded digits."""
    return f"{epoch:012d}"


def epoch_range(epoch: int) -> tuple[str, str]:
    """(start, stop) of the keys `<epoch>/…` of a namespace: start ≤ key < stop."""
    return f"{epoch:012d}/", f"{epoch:012d}0"


def in_epoch(epoch: int, name: str) -> str:
    """`<epoch>/<name>`: an entry of an epoch-keyed namespace (seed, spotrep, vwork, slashed)."""
    return f"{epoch_key(epoch)}/{name}"


def commitment_key(node: str, session: str, step: int, shard: int) -> str:
    return f"{node}/{session}/{step}/{shard}"


def coverage_key(node: str, shard: int) -> str:
    return f"{node}/{shard:05d}"


def pool_key(model: str, node_key: str) -> str:
    """`pool/` key of `node_key` in `model`'s pool (a model may hold `/`: a reader of one
    model's range keeps the keys whose part after `<model>/` is a node key alone)."""
    return f"{model}/{node_key}"


def query_key(query_id: str, gateway: str) -> str:
    """`squery/` and `sqdone/` key: one record per (query id, reporting gateway's address)."""
    return f"{query_id}/{gateway}"


def charge_key(payer: str, gateway: str, kind: str, id: str) -> str:
    return f"{payer}/{gateway}/{kind}/{id}"


def statement_key(epoch: int, page: int) -> str:
    """`payout/` key of page `page` of committee epoch `epoch` (page 0: the epoch key alone)."""
    return epoch_key(epoch) if page == 0 else f"{epoch_key(epoch)}/{page:04d}"


def credit_key(epoch: int, account: str, model: str, shard: int) -> str:
    return f"{epoch_key(epoch)}/{account.lower()}/{shard:05d}/{model}"


def prune_key(epoch: int, ns: str, key: str) -> str:
    return f"{epoch_key(epoch)}/{ns}/{key}"


def expiry_key(until: int, ns: str, key: str) -> str:
    return f"{until:020d}/{ns}/{key}"


# --- prices (prices.py) -----------------------------------------------------------------------

# price/<node>/<shard, 5 digits>: {model, schedule [[from epoch, positions per credit], ...]} in
# epoch order: the node's registered price from each epoch on (0: free); the entries that no
# creditable epoch reads any more are dropped
PRICE = "price"


def price_key(node: str, shard: int) -> str:
    return f"{node}/{shard:05d}"


# leftshard/<node>/<shard, 5 digits>/<epoch, 20 digits>: {price: the node's price record there or
# null}: a shard the node moved away from in that epoch, still redeemable for a while
# (left_shards.py); pruned after its window
LEFT_SHARD = "leftshard"


def left_shard_key(node: str, shard: int, epoch: int) -> str:
    return f"{node}/{shard:05d}/{epoch:020d}"
