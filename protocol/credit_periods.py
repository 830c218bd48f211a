"""Credit key periods and the schedule of each period's on-chain DKG (pure: integers only).

A key period is `key_period_blocks` blocks (genesis `credits.key_period_blocks`), independent of
settlement epochs: period p holds heights p·K + 1 … (p + 1)·K. Each period has its own committee
key X_p, made by a DKG (`protocol.dkg`) the chain runs in three phases of `dkg_phase_blocks` (P)
blocks each, ending with the last block before the period starts:

    config   recorded at the end of block s − 1 (the validator set then: the receivers)
    deal     blocks s … s + P − 1            s = max(2, p·K + 1 − 3P)
    complain blocks s + P … s + 2P − 1
    justify  blocks s + 2P … s + 3P − 1      the key is formed at the end of block s + 3P − 1

For p ≥ 1 the key exists before the period's first block; period 0's run starts at block 2, so
its credits can be minted from block 3P + 2 on. A run that fails (too few dealers: validators
not up yet) is run again, as attempt a + 1, from the block after its end while its period
lasts. A credit names its period and nothing finer: the anonymity set of a credit is the
buyers of its period.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

PHASES = 3
FIRST_DKG_HEIGHT = 2


class DkgWindow(enum.Enum):
    BEFORE = "before"
    DEAL = "deal"
    COMPLAINT = "complaint"
    JUSTIFY = "justify"
    DONE = "done"


@dataclass(frozen=True)
class KeySchedule:
    period_blocks: int
    phase_blocks: int

    def period_of(self, height: int) -> int:
        """The key period of a block height (heights ≤ 0 count as period 0)."""
        return max(0, height - 1) // self.period_blocks

    def period_start(self, period: int) -> int:
        return period * self.period_blocks + 1

    def period_end(self, period: int) -> int:
        return (period + 1) * self.period_blocks

    def dkg_start(self, period: int) -> int:
        """The first deal block of period `period`'s DKG."""
        return max(FIRST_DKG_HEIGHT, self.period_start(period) - PHASES * self.phase_blocks)

    def dkg_config_height(self, period: int) -> int:
        """The block whose end records the run's receivers."""
        return self.dkg_start(period) - 1

    def dkg_finish_height(self, period: int) -> int:
        """The block whose end forms the key."""
        return self.dkg_start(period) + PHASES * self.phase_blocks - 1

    def window(self, period: int, height: int) -> DkgWindow:
        """Which DKG phase of `period`'s first run a block at `height` is in."""
        return self.window_from(self.dkg_start(period), height)

    def window_from(self, start: int, height: int) -> DkgWindow:
        """Which phase of a run whose deal blocks start at `start` a block at `height` is in
        (a run that failed is run again from the block after its end: its own start)."""
        offset = height - start
        if offset < 0:
            return DkgWindow.BEFORE
        phase = offset // self.phase_blocks
        if phase >= PHASES:
            return DkgWindow.DONE
        return (DkgWindow.DEAL, DkgWindow.COMPLAINT, DkgWindow.JUSTIFY)[phase]

    def configured_at(self, height: int) -> list[int]:
        """The periods whose DKG config is recorded at the end of block `height` (0 or 1)."""
        return [p for p in self._near(height) if self.dkg_config_height(p) == height]

    def finished_at(self, height: int) -> list[int]:
        """The periods whose key is formed at the end of block `height` (0 or 1)."""
        return [p for p in self._near(height) if self.dkg_finish_height(p) == height]

    def _near(self, height: int) -> list[int]:
        # a DKG runs within 3P < K blocks before its period: only this period and the next
        current = self.period_of(height)
        return [current, current + 1]
