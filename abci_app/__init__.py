"""The committee chain: an ABCI 2.0 application behind real CometBFT validators.

    python -m abci_app --home <validator home> --listen tcp://127.0.0.1:26658

    __main__.py    entry point: args, logging, signals
    server.py      asyncio ABCI socket server (uvarint-framed protobuf, 4 connections)
    app.py         thin adapters: protobuf Request → State call → protobuf Response
    state.py       the deterministic state machine: tx pipeline, nonces, block lifecycle, app hash
    handlers.py    one function per tx type (registry, lifecycle, stake, commit-reveal,
                   share-chain, verdicts)
    epochs.py      height-driven rules: heartbeat timeouts, epoch leader + challenge list,
                   reputation application
    retention.py   what state costs: unstaked registrations expire, settled records pruned
    reputation.py  PlanetServe sec. 3.4 in fixed point (exact integer rules)
    extensions.py  vote extensions: reputation reports, extended-commit tx, signature checks
    queries.py     path-based JSON queries
    genesis.py     genesis app_state parameters
    store.py       SQLite persistence (one transaction per block; reads, never loaded whole)
    codes.py       every result code
    proto/         CometBFT protobuf classes, generated at build time (never committed)
    testing.py     an in-process chain for tests and benchmarks
    hostile.py     TEST-ONLY Byzantine mode (hidden flag + environment variable, both required)

Tx format: `protocol.committee`. Genesis must set
`consensus_params.abci.vote_extensions_enable_height` (the devnet uses "1").
"""
