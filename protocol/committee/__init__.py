"""Committee-chain transactions: the shared vocabulary of the ABCI app and its clients.

Wire format (one CometBFT tx = the UTF-8 bytes of one canonical JSON object, see
`protocol.canonical`: sorted keys, no whitespace, no floats):

    {"body": {...}, "nonce": 7, "sig": "<128 hex>", "signer": "<64 hex>", "type": "heartbeat"}

- `signer`: the ed25519 public key (32 bytes, lowercase hex) of a node key or a validator's
  CometBFT consensus key. It is also the account id (nonces are per signer).
- `nonce`: strictly greater than the signer's last committed nonce (gaps allowed), < 2**63.
  A tx that passes decoding, signature and nonce checks consumes its nonce even when a state
  rule then rejects it (so its bytes can never be replayed later).
- `sig`: ed25519 signature over `SIGN_DOMAIN + canonical_json({body, nonce, signer, type})`.
- `body`: the type's fields (below). Integers that may exceed 2**53 (`amount`) are decimal
  strings; 32-byte values are `0x`-hex; EVM addresses are 0x-hex (checksum spelling on output).
- A tx whose bytes are not exactly the canonical encoding is rejected (no malleable tx hashes).

Modules, read bottom-up:

    grammar.py        TxDecodeError, the field patterns and limits every body shares
    registry.py       register_node (RegisterNode, its EIP-191 binding), heartbeat, leave,
                      attest_stake
    commitments.py    commit (CommitBatch of CommitmentRecord), reveal (RevealBatch of
                      RevealRecord)
    verification.py   verdict_vote (VerdictVote), verdict_ratify (VerdictRatify),
                      seed_commit / seed_reveal (SeedCommit, SeedReveal, seed_commitment),
                      spot_check_report (SpotCheckReport), verifier_endpoint
                      (VerifierEndpoint)
    settlement.py     work_report (WorkReport: query fees and ChargeItems), payout_vote
                      (PayoutVote)
    credits.py        credit_mint (CreditMint), fund_mint (FundMint), mint_partials
                      (MintPartials), credit_redeem (CreditRedeem): threshold blind BLS
                      bearer credits
    gateways.py       gateway (GatewayBind): a gateway key bound to its payee address
    prices.py         set_price (SetPrice): what a credit buys on a node's shard
    relays.py         relay (RegisterRelay): an overlay relay's endpoint and X25519 key
    relay_credits.py  relay_redeem (RelayRedeem): a relay cashes the credits it was paid
    envelope.py       SignedTx, sign / encode / decode, the type → body registry, and
                      TxSignatureError

Tx types (`type` → dataclass):

    register_node   RegisterNode   node key + EVM address (EIP-191 signature) + role + model/shards
    heartbeat       Heartbeat      keeps a node SERVING (JOIN/DOWN → SERVING)
    leave           Leave          SERVING/JOIN/DOWN → LEFT (final)
    attest_stake    AttestStake    a validator saw `amount` wei staked by `node` on the EVM chain
    commit          CommitBatch    many (session, step, shard, commitment) records
    reveal          RevealBatch    many (session, step, shard, output_hash, salt) openings
    verdict_vote    VerdictVote    a validator's EIP-712 signature over a `Verdict`
    verdict_ratify  VerdictRatify  the same signature over a verdict the committee confirmed
                                   (by a numerics version's quorum), attesting that state
    work_report     WorkReport     a gateway's served counts, settled query fees and charges
    payout_vote     PayoutVote     a validator's EIP-712 signature over an epoch's `PayoutRoot`
    spot_check_report SpotCheckReport  a validator's verifier lists the spot checks it did
    seed_commit     SeedCommit     a validator's verifier commits to its secret challenge seed
                                   for a future epoch (`seed_commitment`)
    seed_reveal     SeedReveal     ... and opens it once that epoch has closed
    verifier_endpoint VerifierEndpoint  where a validator's verifier hands its findings to
                                   the other verifiers (the latest URL counts)
    credit_mint     CreditMint     a payer buys credits: one list of blinded points + a
                                   signed purchase
    fund_mint       FundMint       a validator saw the mint's payer's balance cover it
    mint_partials   MintPartials   a validator's partial signatures for a funded mint
    credit_redeem   CreditRedeem   a compute node cashes the credits it was paid with
    gateway         GatewayBind    a gateway key bound to (or released from) its payee EVM
                                   address, under that address's EIP-712 signature
    set_price       SetPrice       a compute node's positions per credit on a shard
    relay           RegisterRelay  relay key + EVM address (EIP-191 signature) + endpoint +
                                   X25519 key: an overlay relay (listed by /relays once staked)
    credit_lock     CreditLock     a compute node claims credits it was paid with, before it
                                   serves beyond its bound on them (credit_locks.py)
    relay_redeem    RelayRedeem    a relay cashes the credits users paid it with for cloves
                                   that arrived (relay_credits.py)

`TxDecodeError` (malformed bytes or fields) and `TxSignatureError` (bad ed25519 signature) are
typed `ProtocolError`s; the ABCI app maps them to named result codes. The compact binary
encoding of commit and reveal batches is `protocol/commit_batch.py`.
"""
