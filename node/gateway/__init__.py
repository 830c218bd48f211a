"""The gateway: an OpenAI-compatible HTTP API in front of the network, paid per question.

    config.py      GatewayConfig: one frozen dataclass, every field with its unit
    errors.py      ApiError and its subclasses; the OpenAI error shape {"error": {...}}
    requests.py    the one parser of request bodies → ChatRequest / CompletionRequest or a 400
    textstream.py  token ids → text deltas with stop strings and partial UTF-8 held back
    sse.py         server-sent events framing (`data: {...}\\n\\n`, `data: [DONE]`)
    shapes.py      OpenAI's response objects (chat, completion, chunks, usage, logprobs)
    router.py      routable nodes from the committee chain → a random circuit per session
    models.py      the models served (a question's `model` picks one: its head and router)
    escrow_reads.py  what the gateway reads from QueryEscrow (one call per check), cached and
                   capped so a flood of fake keys cannot fan out RPC calls
    payments.py    the payment desk: deposits, vouchers and payment keys checked and held (a
                   Reservation per question), charged or released once; receipts signed
    payment_state.py  one question's payment: reserved → serving → charged | released
    receipt_log.py the append-only, fsync'd receipt log a restart replays
    timeline.py    the settlement timeline: minimum voucher/key lifetime, refund margin
    settlement.py  the work ledger (journal) and the reports it sends the committee chain
    circuits.py    CircuitPool: one live CircuitClient (node-to-node forwarding) per circuit
    credit_payer.py  the hosted gateway pays charging nodes with its credits (`HostedPayer`),
                   and fails a question it cannot pay by name (`GatewayOutOfCredits`, 503)
    topup.py       the background task that keeps its credit wallet stocked (buys when low,
                   finishes purchases in flight, drops expired credits)
    engine.py      one generation over a circuit (logprobs, retries before the first token)
    dapp.py        the web dApp's routes: the page, its config, a read-only network view
    app.py         aiohttp app factory and thin handlers
    run.py         start-up: wallet, EVM chain, committee, client head; serve
    client.py      the other side: asking a gateway and paying for it (`planet ask --pay`)

Nodes never receive the wallet, the query id or the receipt: the gateway checks payments and
sends nodes only activations over a circuit (per-hop capabilities, positions, activations), and
pays those that charge with bearer credits, which name no one.
"""
