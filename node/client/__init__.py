"""The client of a circuit: runs a prompt through the shard nodes of one circuit, samples tokens.

types.py         Hop, Head (the client's part of the model, a Protocol), Timings
circuit.py       CircuitClient: node-to-node forwarding over WebSockets (K + 1 transfers a
                 token); the one transport (the gateway, `planet ask`, benches)
capabilities.py  per-hop session capabilities and feed tokens derived from a client-held secret
info.py          GET /info of a circuit's nodes; the check that they form the manifest's circuit
answers.py       the boundary against nodes' HTTP answers: bounded reads, strict checks, errors
sampling.py      greedy / temperature + top-p sampling, deterministic with a seed
nodesfile.py     the nodes file (manifest path + ordered node URLs) and its default location
"""
