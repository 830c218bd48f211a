"""Real local networks that tests and benchmarks start (never imported by the product).

gateway_net.py   anvil + contracts, one CometBFT validator with the committee app, compute nodes
                 kept SERVING by heartbeats from the calling process, the gateway (GatewayNet)
verifier_net.py  GatewayNet + `planet verifier serve`, optional cheating nodes (VerifierNet)
"""
