"""Test doubles: stand-ins for product parts that only tests (and benchmarks) use.

fake_shard.py     FakeShard, FakeCache: a ShardBackend with arithmetic instead of layers
tiny_model.py     make_tiny_model: a tiny random Llama/Qwen2 Hugging Face directory, offline
cheating.py       cheater modes of a compute node (a backend that computes wrongly on purpose)
cheating_node.py  `planet node serve` + `--cheat MODE`: the entry point that runs a cheating node
cheating_join.py  `planet join` + `--cheat MODE`: an operator joining such a node (the devnet's
                  `--cheat-node`)
"""
