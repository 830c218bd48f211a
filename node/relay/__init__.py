"""The overlay's relays: `planet relay serve` (docs/overlay.md).

relay.py   the forwarding: paths, onion set-up, one layer per hop, tear-down
run.py     the process: its X25519 key file, the HTTP server
"""
