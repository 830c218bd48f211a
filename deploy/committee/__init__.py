"""A CometBFT committee network on one host: N validators, one Planet ABCI app process each.

    network.py     `Network`, `Validator`: the manifest (network.json), ports, `load_network`
    cometbft.py    the cometbft binary, config.toml values, node ids
    genesis.py     genesis contents: the app's state, the operators' powers, the EVM addresses
    generate.py    `init_network`: `cometbft testnet`, then our ports, peers, genesis, keys
    processes.py   pid files, spawning, liveness, log tails, `stop_network`
    start.py       `start_network`: apps, then cometbft, then wait for committed blocks
    watchers.py    `start_watchers`: one stake watcher per validator (`python -m node.watcher`)
    status.py      `network_status`: per validator, processes and what its RPC says

Processes run detached (they outlive the command that started them). Layout of a network
directory (default `$PLANET_HOME/committee`, PLANET_HOME=~/.cache/planet):

    network.json                 what init made: chain id, app, validators, ports, node ids
    node<i>/                     CometBFT home of validator i (config/, data/)
    node<i>/app.sqlite           the ABCI app's state (written by the app)
    node<i>/config/operator_key.json   operator key (eth-account keystore, empty password, 0600)
    logs/app<i>.log, logs/cometbft<i>.log, logs/watcher<i>.log
    run/app<i>.pid, run/cometbft<i>.pid, run/watcher<i>.pid

Each validator's operator key (secp256k1, `node.keys.write_operator_key`) is in genesis
`app_state.validators` with the validator's power; `committee_members` returns (operator
address, power) pairs to deploy the `Committee` contract with the same powers, and
`set_genesis_evm` writes the contract's address (and the served models) into every genesis
before the first start. The stake watchers sign with their validator's consensus key;
`stop_network` stops them with the rest.

Ports of validator i, from `base_port` (default 27000): p2p base+10i, RPC base+10i+1,
ABCI app base+10i+2, pprof base+10i+3 (all on 127.0.0.1).

Import from the module that defines a name; this package itself exports nothing.
"""
