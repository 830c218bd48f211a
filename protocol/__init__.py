"""Planet's shared vocabulary: what every process agrees on.

Import-light by rule (checked by import-linter): no torch, aiohttp or web3 providers here.

- `errors`    the one error tree every process raises and translates at its edges
- `canonical` canonical bytes and hashes (anything hashed or signed goes through it)
"""
