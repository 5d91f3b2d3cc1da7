"""Reward shaping on a response's length: DAPO's soft overlong punishment (`algo.overlong`)."""
from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float) -> torch.Tensor:
    """[S] float32 reward to add: 0 up to max_new_tokens - buffer tokens, then falling linearly
    to -penalty at max_new_tokens (DAPO's R_length, verl's overlong_buffer; a cut response,
    at max_new_tokens, gets the whole -penalty)."""
    expected = max_new_tokens - buffer
    excess = lengths.float() - expected
    return (-excess / buffer * penalty).clamp(max=0.0)
