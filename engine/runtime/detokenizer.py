"""Incremental detokenization with stop strings.

Decoding token by token breaks multi-byte characters and merges; instead decode a short
window of recent tokens and emit only the new suffix once it is complete.
"""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer, stop: list[str] | None = None):
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""  # all text decoded so far (stop strings cut off)
        self.emitted = 0  # characters of self.text already returned
        self.prefix_offset = 0
        self.read_offset = 0
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> None:
        self.ids.append(token_id)
        if self.stopped:
            return
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return  # an incomplete character: wait for the next token
        self.text += full[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        for s in self.stop:
            at = self.text.find(s, max(0, self.emitted - len(s)))
            if at >= 0:
                self.text, self.stopped = self.text[:at], True

    def delta(self, final: bool = False) -> str:
        """Text not yet returned; keeps back what could be the start of a stop string."""
        end = (
            len(self.text)
            if final or self.stopped
            else max(self.emitted, len(self.text) - self.holdback)
        )
        out, self.emitted = self.text[self.emitted : end], end
        return out
