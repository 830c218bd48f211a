"""The whole Planet network on one machine: `planet devnet up | status | down`.

`up` runs, each step reported through `progress`:

1. the model prepared in N shards (cached under $PLANET_HOME/models), and the second model
   (the 1-part int8 set; `--one-model`: none);
2. anvil (npm), detached, on a free port;
3. a CometBFT committee of V validators (`deploy.committee`), its operator keys in genesis;
4. the contracts deployed with the Committee = those operators and powers, the genesis given
   the Committee address and the models' shard counts, the models registered
   (`ModelRegistry.devRegister`, chain 31337 only);
5. the validators with their apps and stake watchers (which also publish the credit keys);
6. per compute node an operator home funded from anvil's dev account, then the SAME commands an
   operator types, as subprocesses: `planet stake --role compute --amount 1` and
   `planet join --model M --shard K --credit-positions 64` (which waits until the node is
   routable; the node charges a bearer credit per 64 positions, signed with the keys every
   validator's stake watcher publishes; `--credit-positions 0`: free); node0 joins as a
   multi-model host and operator seat0 joins the second model into its process (`planet join
   --into`, in the background during step 7: second_model.py);
7. the gateway (`planet gateway serve`, unless `--no-gateway`; started before the joins, so it
   loads its part of the model meanwhile, after its wallet deposited 1 ETH at the escrow's own
   address, the balance its credits are bought from; ready when `/health` answers), then the
   verifiers (`planet verifier serve`) if asked for; when the nodes charge, `up` ends once the
   gateway's top-up bought its first credits.

Run directory `$PLANET_HOME/devnet/`:

    nodes.json         a nodes file over the joined nodes (`planet ask --nodes`, unpaid)
    devnet.json        what runs where (evm_rpc, chain_id, deployment, committee_rpc list,
                       gateway_url, model_hash, manifest, accounts, contracts, pids), and
                       startup_s / steps_s (seconds from the start when each step finished)
    password           the devnet keystores' password (dev only, mode 0600)
    deployment.json    contract addresses and ABIs
    logs/              anvil.log, gateway.log
    committee/         the validators (logs/app<i>.log, cometbft<i>.log, watcher<i>.log)
    operators/node<i>/ an operator home: wallet.json, node_key.json, config.toml, stake.log,
                       join.log, run/ (node-<K>.log, agent.log, joined.json)
    gateway/           the gateway's wallet, committee key, receipts and credits.json (the
                       credits it pays the nodes with: `planet credits show --credits-file`)
    user/wallet.json   a wallet funded with 100 ETH for paid questions (`planet ask --pay`)

A failed step raises a `PlanetError` naming the process and its log; `up` then stops what it
started. `down` stops everything (agents first, so they send `leave`) and is idempotent.

    plan.py        `DevnetOptions`, sizes and funds, the state file (`read_state`, `write_state`)
    processes.py   free ports, spawning, `planet_argv` (a `planet` command as a subprocess),
                   waiting for HTTP, commands run in parallel, `StepFailed`
    operators.py   operator homes funded from anvil's dev account; `planet stake` / `planet join`
    services.py    the gateway and the verifiers (`planet gateway serve`, `planet verifier serve`)
    second_model.py  the second model: seat homes, node0 as a host, the seats' `join --into`
    up.py          `up`: the seven steps
    status.py      `status`, `running`
    down.py        `down`

Import from the module that defines a name; this package itself exports nothing.
"""
