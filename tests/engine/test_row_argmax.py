"""engine.runtime.row_argmax against torch.argmax: ties, NaN, a tail past the last chunk."""

import pytest
import torch

from engine.runtime.row_argmax import CHUNK, row_argmax


@pytest.mark.parametrize("V", [7, CHUNK, 2 * CHUNK, 128256, 151936, 49152])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_argmax_equals_torch_argmax(V, dtype):
    gen = torch.Generator().manual_seed(V)
    logits = torch.randn(3, V, generator=gen).to(dtype)
    assert torch.equal(row_argmax(logits), logits.argmax(dim=-1))
    # the first of equal maxima, in different chunks and in the tail
    tied = torch.zeros(3, V, dtype=dtype)
    places = [V - 1, V // 2, 0]
    for row, place in enumerate(places):
        tied[row, place] = 5
        tied[row, V - 1] = 5
    assert row_argmax(tied).tolist() == tied.argmax(dim=-1).tolist() == places
    if dtype == torch.float32:  # NaN counts as the largest, as in torch.argmax
        logits[1, V // 3] = float("nan")
        assert torch.equal(row_argmax(logits), logits.argmax(dim=-1))
