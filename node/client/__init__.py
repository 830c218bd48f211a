"""Pipeline client: runs a prompt through a chain of shard nodes and samples tokens.

nodesfile.py  the nodes file (manifest path + ordered node URLs) and its default location
sampling.py   greedy / temperature + top-p sampling, deterministic with a seed
pipeline.py   PipelineClient: the star relay, keep-alive HTTP to each node (POST /v1/forward)
chain.py      ChainClient: node-to-node forwarding over WebSockets (K + 1 transfers a token);
              the product path (gateway, `planet ask`)
capabilities.py  per-hop session capabilities derived from a client-held secret
answers.py    the boundary against node answers: bounded reads, strict checks, named errors
"""
