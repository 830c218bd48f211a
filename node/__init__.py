"""Everything that runs next to a GPU or a user.

Model shards, the compute node, the client, chain clients and the `planet` CLI.
"""
