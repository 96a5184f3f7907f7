"""The KV cache kept from one reply of a chat to the next.

Each turn of a chat sends the whole conversation again, so without this every reply would read
the earlier turns anew: their attention and, for an offloaded model, the experts they route,
streamed in layer by layer. A kept cache holds the keys and values of the previous reply's prompt
and reply; the next prompt's tokens that it holds (the longest common prefix: a chat template may
render the reply back with other tokens, or leave parts of it out) need no prefill, and the rest
is cut off. Only a plain ``DynamicCache`` of full-attention layers is kept: sliding-window and
linear-attention layers drop past states that a cut would need.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers.cache_utils import DynamicCache, DynamicLayer


@dataclass
class KeptContext:
    cache: DynamicCache
    tokens: list[int]
    """The tokens whose keys and values ``cache`` holds, in order."""

    @classmethod
    def after(cls, cache: object, sequence: Sequence[int]) -> KeptContext | None:
        """What to keep of a generation that produced ``sequence`` (prompt and reply) with
        ``cache``, if that cache can be cut back; None otherwise."""
        if type(cache) is not DynamicCache or not all(type(layer) is DynamicLayer for layer in cache.layers):
            return None
        held = cache.get_seq_length()
        if not 0 < held <= len(sequence):
            return None
        return cls(cache, list(sequence[:held]))

    def reuse_for(self, prompt_ids: Sequence[int]) -> int:
        """Cut the cache back to the tokens ``prompt_ids`` starts with, leaving at least the
        prompt's last token to compute (its logits give the first reply token); returns how
        many tokens it still holds (0: nothing to reuse)."""
        common = 0
        for kept, new in zip(self.tokens, prompt_ids):
            if kept != new:
                break
            common += 1
        reused = min(common, len(prompt_ids) - 1)
        if 0 < reused < len(self.tokens):
            self.cache.crop(reused - len(self.tokens))  # a negative count: the tokens to remove
            del self.tokens[reused:]
        return max(reused, 0)

    def back_to_tokens(self) -> None:
        """Cut every layer back to ``tokens``: a prefill stopped midway added the new prompt's keys
        and values to the layers it reached, not to the others."""
        held = len(self.tokens)
        for layer in self.cache.layers:
            excess = layer.get_seq_length() - held
            if excess > 0:
                layer.crop(-excess)
