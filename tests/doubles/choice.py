"""A cost book's randomness that makes the choice: the first or the last of the near-equal
candidates (node/client/costs.py calls `randrange(len(near))`), so a test decides which of two
tied replicas a question tries.

    pick = FirstOrLast()
    book = CostBook(rng=pick)
    pick.last = True
"""

from __future__ import annotations


class FirstOrLast:
    def __init__(self) -> None:
        self.last = False

    def randrange(self, n: int) -> int:
        return n - 1 if self.last else 0
