"""The committee chain: an ABCI 2.0 application behind real CometBFT validators.

    python -m abci_app --home <validator home> --listen tcp://127.0.0.1:26658

Modules, top (process) to bottom (storage); a module imports only the ones below it, and the
feature modules never import each other:

    __main__.py        entry point: args, logging, signals; `serve()` takes the app class
    server.py          asyncio ABCI socket server (uvarint-framed protobuf, 4 connections)
    app.py             thin adapters: protobuf Request → StateMachine call → protobuf Response
    queries.py         path-based JSON queries over the committed state (`query`, ROUTES)
    payout_queries.py  the settlement queries (/payouts, /payouts/proof, /credits)
    relay_queries.py   /relays: the staked, live overlay relays, a page at a time
    relay_credits.py   relay_redeem: a relay cashes the credits it was paid; /relay_credits
    query_params.py    query parameters: one parse step to typed values or BAD_QUERY
    machine.py         the deterministic state machine: CheckTx, proposals, FinalizeBlock
                       (nonces, atomic txs, end-of-block rules), Commit
    dispatch.py        tx type → its rule (the one dispatcher)
    extensions.py      vote extensions: reputation reports, extended-commit tx, signatures
    registry.py        register_node, relay, heartbeat, leave, attest_stake; heartbeat timeouts and
                       unstaked registrations expiring
    commitments.py     commit, reveal; equivocation and reveal-mismatch evidence
    verdicts.py        verdict_vote; accusations settled at the epoch after the first vote
    ratifications.py   verdict_ratify: validators attest a confirmed verdict (a numerics
                       version's quorum) so that its signatures reach FraudProofs' 2/3
    seeds.py           seed_commit, seed_reveal (verifier seeds)
    spot_reports.py    spot_check_report (spot checks credited to verifiers)
    verifier_endpoints.py  verifier_endpoint (where a verifier forwards its findings)
    settlement.py      work_report, payout_vote; the epoch close (payout roots)
    credits.py         credit_mint, fund_mint, credit_redeem: threshold blind BLS bearer
                       credits under the key period's committee key
    credit_queries.py  /credit_keys (the credits' clock), /mints, /credit_spent
    prices.py          set_price: a node's positions per credit (changes from the next
                       epoch), what a redemption consumes per credit, /prices
    epochs.py          epoch records (leader, challenge list, verifiers), reputation updates
    retention.py       pruning of settled and time-bound records
    rules.py           what every rule shares: signer checks, epoch of a height, pruning index
    state.py           State: namespaced entries (tx → block → committed), app hash, commit
    schema.py          every key namespace, named once with what it holds; lifecycle values
    genesis.py         genesis app_state parameters
    store.py           SQLite persistence (one transaction per block; reads, never loaded whole)
    encoding.py        uvarint helpers (ABCI framing, protobuf lengths)
    codes.py           every result code
    proto/             CometBFT protobuf classes, generated at build time (never committed)

Tx format: `protocol.committee`; reputation rules: `protocol.reputation`. Genesis must set
`consensus_params.abci.vote_extensions_enable_height` (the devnet uses "1"). In-process chain
for tests and benchmarks: `tests/committee_chain.py`; a Byzantine app for tests:
`tests/byzantine_app.py`.
"""
