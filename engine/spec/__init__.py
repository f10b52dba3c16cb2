"""Speculative decoding (issue 7): proposers and the acceptance rules. The verification step
that runs the target over k+1 positions with one shared sparse selection is not built yet."""
