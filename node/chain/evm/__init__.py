"""The EVM settlement chain through web3 (v8): one binding per Planet contract over one sender.

    rpc.py           `connect` (a web3 HTTP connection known to answer), `rpc_guard`
    errors.py        `ContractRevert` and its typed subclasses, `RevertDecoder`, `rpc_error`
    deployment.py    `Deployment`: the deployment file (chain, addresses, ABIs, config)
    sender.py        `Sender`: signs, sends, waits, keeps the nonce; `Binding`, `TxResult`
    staking.py       `Staking`             escrow.py     `QueryEscrow`
    fraud_proofs.py  `FraudProofs`         committee.py  `Committee`
    registry.py      `ModelRegistry`
    account.py       `PlanetChain`: one account's sender with the five bindings

Import from the module that defines a name; this package itself exports nothing.
"""
