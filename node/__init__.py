"""Everything that runs next to a GPU or a user.

Model shards, the compute node, the client, chain clients and the `planet` CLI.
"""

from node import lazy_bls

lazy_bls.install()  # web3's import without py_ecc's pairing tables (node/lazy_bls.py)
