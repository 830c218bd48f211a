"""The overlay's relays: `planet relay serve` (docs/overlay.md).

relay.py   the forwarding: paths, onion set-up, one layer per hop, tear-down
run.py     the process: its X25519 key file, the HTTP server
earnings.py  the credits users paid it with (PAY cells), kept in <home>/relay-credits/
redeem.py  redeeming them on the committee (`relay_redeem`)
registration.py  its registration and heartbeats on the committee
"""
