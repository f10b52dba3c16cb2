"""Prompt-lookup proposer: continue the text the way it continued the last time the same
words appeared in the session's own context (strong for code and for quotes from a book).
"""

from __future__ import annotations


class PromptLookup:
    """Find the longest suffix of the tokens (max_ngram down to min_ngram long) that occurred
    earlier, latest occurrence first, and propose the up to k tokens that followed it."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2, window: int = 1 << 20) -> None:
        assert 1 <= min_ngram <= max_ngram
        self.max_ngram, self.min_ngram, self.window = max_ngram, min_ngram, window

    def propose(self, tokens: list[int], k: int) -> list[int]:
        n = len(tokens)
        start = max(0, n - self.window)
        for size in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            suffix = tokens[n - size :]
            # latest earlier occurrence whose continuation is not the suffix itself
            for i in range(n - size - 1, start - 1, -1):
                if tokens[i : i + size] == suffix:
                    # copy what followed, with overlap (as LZ77 does): a match close to the
                    # end continues into the proposal itself, so a repeating pattern is
                    # proposed k tokens long, not just up to the end of the context
                    out: list[int] = []
                    for j in range(i + size, i + size + k):
                        out.append(tokens[j] if j < n else out[j - n])
                    return out
        return []
