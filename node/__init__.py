"""Everything that runs next to a GPU or a user: model shards, compute node, client, chain clients, CLI."""
