"""Pipeline client: runs a prompt through a chain of shard nodes and samples tokens.

nodesfile.py  the nodes file (manifest path + ordered node URLs) and its default location
sampling.py   greedy / temperature + top-p sampling, deterministic with a seed
pipeline.py   PipelineClient: keep-alive HTTP to each node, prefill, decode, cleanup
capabilities.py  per-hop session capabilities derived from a client-held secret
answers.py    the boundary against node answers: bounded reads, strict checks, named errors
"""
