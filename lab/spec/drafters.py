"""Drafters: what proposes the tokens a speculative round verifies.

`NgramDrafter` is prompt lookup decoding (Saxena, 2023, "Prompt Lookup Decoding"; vLLM's `ngram` speculative
method): find the most recent earlier occurrence of the sequence's last n tokens (n from max_n down to min_n)
and propose the k tokens that followed it. It costs no model forward (its cost ratio c is ~0) and proposes
deterministically (q one-hot), so verification accepts a draft with the target's probability of it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class NgramDrafter:
    min_n: int = 1
    max_n: int = 3

    def __post_init__(self):
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier match of the trailing n-gram (none: no match)."""
        for n in range(min(self.max_n, len(token_ids) - 1), self.min_n - 1, -1):
            tail = token_ids[-n:]
            for start in range(len(token_ids) - n - 1, -1, -1):  # latest match first, not the tail itself
                if token_ids[start:start + n] == tail:
                    return token_ids[start + n:start + n + k]
        return []
