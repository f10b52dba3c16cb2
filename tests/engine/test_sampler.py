"""Sampling pieces: filters, the repetition penalty, and seeding, on fixed logits."""

from __future__ import annotations

import torch

from engine.layers.sampler import filter_logits, penalize, sample
from engine.sampling_params import SamplingParams


def test_repetition_penalty_scales_generated_tokens_only():
    row = torch.tensor([2.0, -1.0, 1.5, 0.5])
    out = penalize(row, [0, 1, 0], 2.0)
    assert out.tolist() == [1.0, -2.0, 1.5, 0.5]
    assert penalize(row, [0], 1.0) is row  # off: untouched


def test_penalty_changes_the_greedy_choice_and_one_keeps_it():
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    plain = sample(logits, [SamplingParams()], [None], [[0]])
    penalised = sample(logits, [SamplingParams(repetition_penalty=1.2)], [None], [[0]])
    assert plain == [0] and penalised == [1]


def test_top_k_and_top_p_filters():
    row = torch.tensor([4.0, 3.0, 2.0, 1.0])
    assert torch.isinf(filter_logits(row, 2, 1.0))[2:].all()
    kept = ~torch.isinf(filter_logits(row, 0, 0.7))
    assert kept.tolist() == [True, True, False, False]


def test_seeded_sampling_repeats():
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=1.0, seed=3)]
    draw = lambda: sample(logits, params, [torch.Generator().manual_seed(3)])  # noqa: E731
    assert draw() == draw()


def test_non_finite_parameters_are_refused_and_tiny_temperatures_are_greedy():
    import math

    import pytest

    for field in ("temperature", "top_p", "repetition_penalty"):
        for bad in (math.nan, math.inf):
            with pytest.raises(ValueError, match="finite"):
                SamplingParams(**{field: bad})
    # logits / 1e-300 overflow float32: such a temperature samples the argmax
    p = SamplingParams(temperature=1e-300, seed=0)
    assert p.greedy
    logits = torch.tensor([[0.5, 3.0, -1.0]])
    assert sample(logits, [p], [torch.Generator().manual_seed(0)]) == [1]
