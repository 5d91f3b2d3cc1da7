"""Random rollout batches for the update's equality tests: groups of samples that share a
random prompt, responses of random tokens, engine log-probs near a level."""
from __future__ import annotations

from typing import Callable

import torch

from trainer.rollouts import Rollouts


def random_rollouts(groups, length: Callable[[torch.Generator], int], *, vocab: int, max_new: int,
                    engine_level: float, seed: int = 0) -> Rollouts:
    """`groups` of (N, prompt length); each response `length(g)` tokens (truncated when it is
    `max_new`); random advantages, zero rewards."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses, group = [], [], []
    for gi, (n, plen) in enumerate(groups):
        prompt = torch.randint(1, vocab, (plen,), generator=g).tolist()
        for _ in range(n):
            size = length(g)
            prompts.append(prompt)
            responses.append(torch.randint(1, vocab, (size,), generator=g).tolist())
            group.append(gi)
    S = len(responses)
    engine = [(engine_level + 0.3 * torch.randn(len(r), generator=g)).tolist() for r in responses]
    return Rollouts(prompt_ids=prompts, response_ids=responses, engine_logprobs=engine,
                    group=torch.tensor(group), rewards=torch.zeros(S),
                    truncated=torch.tensor([len(r) == max_new for r in responses]),
                    advantages=torch.randn(S, generator=g))
