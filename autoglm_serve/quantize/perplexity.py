"""Perplexity of a causal LM on a text: the measure of quantization quality in the tests and in
scripts/quantize_sweep.py and scripts/quantize_quality.py."""
from __future__ import annotations

import math

import torch


def perplexity(model, ids: torch.Tensor, window: int = 1024) -> float:
    """exp of the mean next-token loss over ids [1, T], in consecutive windows of ``window``
    tokens, each predicted from its own start (a text longer than the model's context, or than
    a CPU forward should take at once)."""
    loss, count = 0.0, 0
    with torch.no_grad():
        for chunk in ids.split(window, dim=1):
            if chunk.shape[1] > 1:
                loss += model(chunk, labels=chunk).loss.item() * (chunk.shape[1] - 1)
                count += chunk.shape[1] - 1
    return math.exp(loss / count)
