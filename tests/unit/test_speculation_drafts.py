"""How speculative decoding's drafts are made (node/client/speculation.py): the longest repeated
suffix of the whole context wins, a lone repeated token still proposes a short draft, and the
draft's length grows while every guess is kept and returns to its start after a rejection."""

from __future__ import annotations

import pytest

from node.client.speculation import Drafter, SpeculationConfig, longest_match, propose
from protocol.errors import ConfigError

pytestmark = pytest.mark.unit

# the suffix 1 2 3 4 occurred at the start; its last three tokens occurred again more recently
CONTEXT = [1, 2, 3, 4, 10, 11, 12, 9, 2, 3, 4, 20, 21, 22, 1, 2, 3, 4]


def test_the_longest_repeated_suffix_wins_over_a_more_recent_shorter_one() -> None:
    assert longest_match(CONTEXT, 64) == (4, 4)
    assert propose(CONTEXT, SpeculationConfig(lookahead=3)) == [10, 11, 12]
    # capped at 3 tokens of suffix, the most recent 3-token occurrence wins
    assert propose(CONTEXT, SpeculationConfig(lookahead=3, max_ngram=3)) == [20, 21, 22]


def test_matches_longer_than_three_tokens_are_found_across_prompt_and_answer() -> None:
    # a 5-token suffix whose last 3 tokens recur right before it with another continuation
    context = [7, 8, 5, 6, 7, 40, 41, 5, 6, 7, 50, 7, 8, 5, 6, 7]
    assert longest_match(context, 64) == (5, 5)
    assert propose(context, SpeculationConfig(lookahead=2)) == [40, 41]


def test_a_lone_repeated_token_proposes_a_short_draft() -> None:
    context = [5, 1, 2, 3, 4, 7, 5]  # only the last token occurred before
    assert propose(context, SpeculationConfig()) == [1, 2, 3]  # fallback_tokens 3
    assert propose(context, SpeculationConfig(fallback_tokens=2)) == [1, 2]
    assert propose(context, SpeculationConfig(fallback_tokens=0)) == []
    assert propose(context, SpeculationConfig(min_ngram=1)) == [1, 2, 3, 4, 7, 5]
    assert propose([1, 2, 3], SpeculationConfig()) == []  # nothing repeats


def test_the_draft_grows_while_every_guess_is_kept_and_restarts_after_a_rejection() -> None:
    context = list(range(40)) * 2 + [0, 1]  # 0 1 continues with 2 3 4 …
    drafter = Drafter(SpeculationConfig())  # lookahead 16, first drafts 8
    assert drafter.draft(context, 99) == list(range(2, 10))
    drafter.observe(8, 8)  # all kept
    assert drafter.draft(context, 99) == list(range(2, 18))
    drafter.observe(16, 16)
    assert len(drafter.draft(context, 99)) == 16  # capped at lookahead
    drafter.observe(16, 5)  # a rejection
    assert drafter.draft(context, 99) == list(range(2, 10))
    assert drafter.draft(context, 3) == [2, 3, 4]  # never more than the tokens still wanted
    assert drafter.draft(context, 0) == []
    drafter.observe(0, 0)  # a pass without guesses changes nothing
    assert len(drafter.draft(context, 99)) == 8
    small = Drafter(SpeculationConfig(lookahead=4))  # the first drafts never exceed lookahead
    assert small.draft(context, 99) == [2, 3, 4, 5]


def test_draft_settings_are_checked() -> None:
    with pytest.raises(ConfigError):
        SpeculationConfig(fallback_tokens=17).validate()
    with pytest.raises(ConfigError):
        SpeculationConfig(first_lookahead=0).validate()
    with pytest.raises(ConfigError):
        SpeculationConfig(max_ngram=5000).validate()


def test_lone_token_drafts_stop_when_their_passes_cost_more_than_they_save() -> None:
    context = [5, 1, 2, 3, 4, 7, 5]  # only a lone-token match: the fallback draft
    fast = Drafter(SpeculationConfig())
    assert fast.draft(context, 99) == [1, 2, 3]  # untimed: sent
    fast.observe(3, 0, 0.090)  # rejected, and a pass with guesses took 90 ms
    fast.observe(0, 0, 0.060)  # a plain pass 60 ms: p = 1/3 of 60 ms < 30 ms extra
    assert fast.draft(context, 99) == []
    slow = Drafter(SpeculationConfig())  # 50 ms links: passes ~260 ms, guesses +30 ms
    slow.draft(context, 99)
    slow.observe(3, 0, 0.290)
    slow.observe(0, 0, 0.260)  # 1/3 of 260 ms > 30 ms
    assert slow.draft(context, 99) == [1, 2, 3]
    # full drafts (a longer match) are not gated
    assert fast.draft([1, 2, 3, 1, 2], 99) == [3, 1, 2]
