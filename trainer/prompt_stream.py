"""The training prompt stream: seeded epoch shuffles read through a cursor.

The stream is a pure function of (seed, cursor), so resuming from a checkpoint that stored
the cursor yields exactly the prompts an uninterrupted run would have seen.
"""
from __future__ import annotations

import random
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


class PromptStream:
    def __init__(self, items: Sequence[T], seed: int, cursor: int = 0):
        if not items:
            raise ValueError("the training split is empty")
        self.items = items
        self.seed = seed
        self.cursor = cursor
        self._epoch = -1
        self._order: list[int] = []

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(len(self.items)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._order)
            self._epoch = epoch
        return self._order

    def take(self, k: int, skip: Callable[[T], bool] | None = None) -> list[T]:
        """The next k items; `skip` (the difficulty filter's retired prompts) passes over items
        for which it is true. It must leave at least one item, or this never returns."""
        out = []
        while len(out) < k:
            epoch, pos = divmod(self.cursor, len(self.items))
            item = self.items[self._order_for(epoch)[pos]]
            self.cursor += 1
            if skip is None or not skip(item):
                out.append(item)
        return out


def mix_seed(*parts: int) -> int:
    """A stable 31-bit seed from integers (engines take one seed per call)."""
    h = 0x9E3779B9
    for p in parts:
        h = (h * 0x01000193 ^ (p & 0xFFFFFFFF)) & 0x7FFFFFFF
    return h
