"""`planet`: the one command line, composed at the top of the house.

It registers node's user and operator commands (node/cli/) and the network's commands
(deploy/cli/) into one parser; nothing below imports it. `python -m planet ...` is `planet ...`.
"""
