"""The gateway: an OpenAI-compatible HTTP API in front of the network, paid per question.

    config.py     GatewayConfig: one frozen dataclass, every field with its unit
    errors.py     ApiError and its subclasses; the OpenAI error shape {"error": {...}}
    requests.py   the one parser of request bodies → ChatRequest / CompletionRequest or a 400
    textstream.py token ids → text deltas with stop strings and partial UTF-8 held back
    sse.py        server-sent events framing (`data: {...}\\n\\n`, `data: [DONE]`)
    router.py     routable nodes from the committee chain → a random circuit per session
    payments.py   payment proofs checked against QueryEscrow; receipts signed by the gateway
    chains.py     ChainPool: one live ChainClient (node-to-node forwarding) per circuit, shared
    engine.py     one generation over a circuit (logprobs, retries before the first token)
    app.py        aiohttp app factory and thin handlers
    run.py        start-up: wallet, chain, committee, client head; serve

Nodes never receive the wallet, the query id or the receipt: the gateway checks payments and
sends nodes only activations over the chain (per-hop capabilities, positions, activations).
"""
