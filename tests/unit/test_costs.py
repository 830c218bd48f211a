"""Load-aware choice (node/client/costs.py) and who is paid after a failover
(node/gateway/engine.py `served_circuit`, `Circuit.shares`)."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from node.client.costs import DEFAULT_RTT_S, CostBook
from node.gateway.engine import served_circuit
from node.gateway.router import Circuit, RoutableNode

pytestmark = pytest.mark.unit


def _info(busy_s: float, batches: int, *, queued: int = 0, sessions: int = 0) -> dict:
    return {
        "sessions": sessions,
        "max_sessions": 64,
        "max_batch": 32,
        "max_queued": 256,
        "load": {"decode_s": busy_s, "decode_batches": batches, "queued": queued},
    }


def _book(step_s: dict[str, float], **kwargs) -> CostBook:
    """A book that saw each node's counters twice: 10 forwards of `step_s` each."""
    book = CostBook(rng=random.Random(7), **kwargs)
    for url, step in step_s.items():
        book.observe_info(url, _info(0.0, 0), 0.002)
        book.observe_info(url, _info(10 * step, 10), 0.002)
    return book


def test_costs_step_time_from_info_counters_and_rtt_ewma() -> None:
    book = CostBook(alpha=0.5)
    book.observe_info("a", _info(1.0, 10), 0.010)
    assert book.get("a").step_s is None  # one answer: no difference yet
    book.observe_info("a", _info(1.5, 20), 0.030)
    assert book.get("a").step_s == pytest.approx(0.05)
    assert book.get("a").rtt_s == pytest.approx(0.020)
    assert book.cost_s("a") == pytest.approx(0.010 + 0.05)
    book.observe_info("a", _info(1.0, 5), 0.020)  # a restarted node: counters went back
    assert book.get("a").step_s == pytest.approx(0.05)


def test_costs_queue_and_sessions_raise_the_cost_full_is_overloaded() -> None:
    book = _book({"a": 0.05, "b": 0.05})
    book.observe_info("b", _info(0.5, 10, queued=32, sessions=32), 0.002)
    assert book.cost_s("b") == pytest.approx(0.001 + 0.05 * 2 * 1.5)
    assert not book.overloaded("b")
    book.observe_info("b", _info(0.5, 10, queued=256), 0.002)
    assert book.overloaded("b")
    assert {book.choose(["a", "b"], str) for _ in range(50)} == {"a"}
    assert book.choose(["b"], str) == "b"  # overloaded everywhere: still an answer


def test_costs_random_among_near_equal_never_the_slow_replica() -> None:
    book = _book({"a": 0.050, "b": 0.055, "c": 0.150})  # c: 3x slower
    picks = Counter(book.choose(["a", "b", "c"], str) for _ in range(400))
    assert picks["c"] == 0
    assert picks["a"] > 120 and picks["b"] > 120  # both near-equal replicas get questions


def test_a_node_lying_about_its_load_gets_a_share_never_the_whole_load() -> None:
    """`liar` reports a zero step and an empty queue; its three honest replicas report what
    they do. Trusting the claim sent every position to the liar; now it shares them."""
    book = _book({"liar": 0.0, "a": 0.050, "b": 0.052, "c": 0.055})
    picks = Counter(book.choose(["liar", "a", "b", "c"], str) for _ in range(800))
    assert picks["liar"] < 400, picks  # was 800 of 800
    assert min(picks[k] for k in "abc") > 100, picks
    # between two replicas there is no floor: a 3x slower one stays out (costs.py docstring)
    book = _book({"fast": 0.050, "slow": 0.150})
    assert Counter(book.choose(["fast", "slow"], str) for _ in range(400))["slow"] == 0
    # and a slow node stays out even beside a liar
    book = _book({"liar": 0.0, "a": 0.050, "b": 0.050, "slow": 0.200})
    assert Counter(book.choose(["liar", "a", "b", "slow"], str) for _ in range(400))["slow"] == 0


def _run(book: CostBook, true_s: dict[str, float], rounds: int, overhead_s: float = 0.030):
    """`rounds` questions on one shard: the book chooses, the client sees the pass take the
    chosen node's true step plus what the rest of the circuit adds (with a little jitter)."""
    jitter = random.Random(11)
    picks: Counter[str] = Counter()
    for _ in range(rounds):
        chosen = book.choose(list(true_s), str)
        assert chosen is not None
        picks[chosen] += 1
        book.observe_circuit([chosen], overhead_s + true_s[chosen] + jitter.uniform(0, 0.004))
    return picks


def test_a_liar_between_two_replicas_is_priced_at_what_the_client_sees() -> None:
    """Two replicas, no claim floor: `liar` claims a zero step but computes as slowly as
    `slow` really does (3x `honest`); what the client's passes show prices it out."""
    book = _book({"liar": 0.0, "honest": 0.050})
    picks = _run(book, {"liar": 0.150, "honest": 0.050}, 300)
    assert picks["honest"] > 280, picks  # the liar: tried, measured, then left out
    # as fast as it claims, it is no liar: the two share the load
    book = _book({"fast": 0.0, "honest": 0.050})
    picks = _run(book, {"fast": 0.050, "honest": 0.050}, 300)
    assert min(picks.values()) > 60, picks


def test_seen_passes_keep_a_slow_replica_out_and_an_over_claimer_draws_nothing() -> None:
    clock = [0.0]
    book = CostBook(rng=random.Random(5), clock=lambda: clock[0])
    for url, step in {"fast": 0.050, "slow": 0.150}.items():
        book.observe_info(url, _info(0.0, 0), 0.002)
        book.observe_info(url, _info(10 * step, 10), 0.002)
    picks = _run(book, {"fast": 0.050, "slow": 0.150}, 300)
    assert picks["slow"] <= 2, picks  # tried once when not seen lately, then left out
    clock[0] += 61  # seen passes age out: the slow node is tried again, once
    assert _run(book, {"fast": 0.050, "slow": 0.150}, 100)["slow"] <= 2
    # a node claiming 3x its cost: never more than its share
    book = _book({"modest": 0.150, "a": 0.050, "b": 0.050})
    picks = _run(book, {"modest": 0.050, "a": 0.050, "b": 0.050}, 300)
    assert picks["modest"] < 150, picks


def test_costs_unknown_node_gets_the_median_step_and_default_rtt() -> None:
    book = _book({"a": 0.05, "b": 0.07})
    assert book.cost_s("new", default_step_s=0.06) == pytest.approx(DEFAULT_RTT_S / 2 + 0.06)
    book.observe_info("x", {"load": {"decode_s": "junk", "decode_batches": float("nan")}}, 0.001)
    assert book.get("x").step_s is None and book.get("x").max_batch == 1


def test_costs_failure_counts_as_a_slow_round_trip() -> None:
    book = _book({"a": 0.05, "b": 0.05})
    book.observe_failure("b")
    assert book.cost_s("b") > book.cost_s("a")


A, B, C, D = (
    RoutableNode(k * 64, f"http://{k}", s) for k, s in zip("abcd", (0, 1, 1, 0), strict=True)
)


def test_served_circuit_without_failover_is_the_circuit() -> None:
    only = Circuit((A, B))
    assert served_circuit([only], []) is only


def test_served_circuit_after_failovers_lists_every_node_that_served() -> None:
    """B failed after 12 positions (A and B computed them), then the replacement C answered
    everything (replay + new); then A failed after 20 in a circuit (A, C), and D took over."""
    circuits = [Circuit((A, B)), Circuit((A, C)), Circuit((D, C))]
    served = served_circuit(circuits, [12, 20])
    assert served.nodes == (D, C, A, B)  # the final circuit first, then earlier nodes
    assert served.keys == (D.key, C.key, A.key, B.key)


def test_served_circuit_when_every_circuit_failed_lists_each_that_answered() -> None:
    """The question failed: (A, B) answered 12 positions, then its replacement (A, C) 15."""
    circuits = [Circuit((A, B)), Circuit((A, C))]
    assert served_circuit(circuits, [12, 15]).nodes == (A, C, B)
    alone = served_circuit([Circuit((A, B))], [7])
    assert alone.nodes == (A, B)


def test_a_node_not_measured_yet_is_chosen_like_a_typical_one() -> None:
    """An unmeasured node (a gateway verifies and measures a node only once it used it) must
    not starve behind the default round trip guess while its replica is measured fast."""
    book = CostBook(rng=random.Random(3))
    book.observe_info("measured", {"sessions": 0, "max_sessions": 64}, 0.002)
    picks = {book.choose(["measured", "new"], lambda u: u) for _ in range(40)}
    assert picks == {"measured", "new"}


def test_trials_of_a_node_seen_slow_back_off_and_happen_one_at_a_time() -> None:
    """A node 3x slower than its replica is tried when not seen lately, but each trial in a row
    waits twice as long as the last (120, 240, 480 s, then every 600 s); questions that start
    together make one trial, not one each; a node that is among the near-equal is never held
    back (its row ends when it is picked while seen)."""
    clock = [0.0]
    book = CostBook(rng=random.Random(9), clock=lambda: clock[0])
    true_s = {"fast": 0.050, "slow": 0.150}
    for url, step in true_s.items():
        book.observe_info(url, _info(0.0, 0), 0.002)
        book.observe_info(url, _info(10 * step, 10), 0.002)
    book.observe_circuit(["fast"], 0.030 + true_s["fast"])  # the first question went to fast
    trials = []
    while clock[0] < 2400:  # one question every 2 s for 40 minutes
        chosen = book.choose(list(true_s), str)
        if chosen == "slow":
            trials.append(clock[0])
        book.observe_circuit([chosen], 0.030 + true_s[chosen])
        clock[0] += 2
    gaps = [b - a for a, b in itertools.pairwise(trials)]
    # (once due, a trial is a coin flip per question: the tried node counts as the cheapest,
    # tied with it). The old rule tried it about once a minute: 36 trials in 40 minutes
    assert trials[0] == 0 and len(trials) == 6, trials
    for gap, due in zip(gaps, [120, 240, 480, 600, 600], strict=True):
        assert due <= gap <= due + 12, gaps
    # eight questions start before any pass is seen: one of them tries the slow node
    clock[0] = book.get("slow").trial_after_s  # due again; fast was seen just now
    book.observe_circuit(["fast"], 0.030 + true_s["fast"])
    picks = Counter(book.choose(list(true_s), str) for _ in range(8))
    assert picks == Counter(fast=7, slow=1), picks
    # near-equal replicas: both always in rotation, however long it runs
    clock[0] = 0.0
    book = _book({"a": 0.050, "b": 0.052}, clock=lambda: clock[0])
    counts: Counter[str] = Counter()
    for minute in range(30):
        picks = _run(book, {"a": 0.050, "b": 0.052}, 30)
        counts.update(picks)
        assert min(picks["a"], picks["b"]) > 3, (minute, picks)
        clock[0] += 60
    assert min(counts.values()) > 300, counts


def test_a_node_due_for_a_trial_is_tried_first_not_on_a_coin_flip() -> None:
    """A fresh client saw one replica (its first question's); the next question tries the
    other one, whatever the random draw: the cold start ends after one question per replica."""
    for seed in range(20):
        book = CostBook(rng=random.Random(seed))
        for url in ("seen", "new"):
            book.observe_info(url, _info(0.0, 0), 0.002)
            book.observe_info(url, _info(0.5, 10), 0.002)
        book.observe_circuit(["seen"], 0.080)
        assert book.choose(["seen", "new"], str) == "new", seed
        assert book.get("new").trials == 1  # a trial: backed off if it turns out slow


def test_a_node_due_for_a_trial_is_tried_before_a_replica_holding_the_prompts_prefix() -> None:
    """A new replica holds no prefix: were the prefix preferred before the trial, a network
    whose questions share a system prompt would never try it, nor pay it (seen on the devnet:
    a new operator's node was never routed a question)."""
    for seed in range(20):
        book = CostBook(rng=random.Random(seed))
        for url in ("holder", "new"):
            book.observe_info(url, _info(0.0, 0), 0.002)
            book.observe_info(url, _info(0.5, 10), 0.002)
        book.observe_circuit(["holder"], 0.080)
        assert book.choose(["holder", "new"], str, _holds_three) == "new", seed
        # once tried, the prefix decides among the near-cheapest again
        book.observe_circuit(["new"], 0.080)
        assert book.choose(["holder", "new"], str, _holds_three) == "holder"


def _holds_three(url: str) -> int:
    return 3 if url == "holder" else 0


def test_a_node_met_slow_on_a_cold_start_is_not_retried_as_soon_as_its_passes_age_out() -> None:
    """A fresh client's first question went through the slow node (nothing was seen yet, so
    no trial); once the fast one is seen, the slow one is outside the band, which counts as a
    failed trial: it is not retried before its passes age out and 120 s more."""
    clock = [0.0]
    book = CostBook(rng=random.Random(1), clock=lambda: clock[0])
    true_s = {"fast": 0.050, "slow": 0.150}
    for url, step in true_s.items():
        book.observe_info(url, _info(0.0, 0), 0.002)
        book.observe_info(url, _info(10 * step, 10), 0.002)
    book.observe_circuit(["slow"], 0.030 + true_s["slow"])  # the cold start's pick
    tried = []
    while clock[0] < 400:
        chosen = book.choose(list(true_s), str)
        if chosen == "slow":
            tried.append(clock[0])
        book.observe_circuit([chosen], 0.030 + true_s[chosen])
        clock[0] += 2
    assert tried and tried[0] >= 60 + 120, tried  # the old rule: again at 62 s
