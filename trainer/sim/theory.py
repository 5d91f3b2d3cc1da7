"""The paper's one-step token-level theory (BroRL section 2; docs/algorithm.md, "The theory").

Setting: vocabulary logits z, p = softmax(z); a correct set P; N tokens drawn. Each DISTINCT
sampled token gets reward R_c (correct) or R_w (wrong); unsampled tokens get 0. The logit
step is dz_j = (eta/N) p_j (R_j - S_R) with the batch mood S_R = R_c P_pos + R_w P_neg.

Reading of the step (a judgement call, documented): dz_j = (eta/N) p_j (R_j - S_R) is
exactly (eta/N) times the gradient with respect to z_j of sum_{k sampled} R_k p_k, the
objective linear in probabilities that the simulation (section 4.1) also uses. Tokens
sampled several times count once: P_pos, P_neg, A2 and B2 are sums over the set of
distinct sampled tokens, which is what the theorem's second moments are defined over.

Theorem 1 (mass balance), first order in eta:
  dQ_pos = (eta/N) [ (R_c - S_R) Q_neg A2 + (S_R - R_w) Q_pos B2
                     + S_R (Q_pos U_neg2 - Q_neg U_pos2) ]
Lemma 2: E[p^2 1{token unsampled in N draws}] = p^2 (1 - p)^N.

Pure functions on float64 torch tensors, reused by the simulation command and the tests.
"""
from __future__ import annotations

import torch


def batch_mood(p: torch.Tensor, correct_mask: torch.Tensor, sampled_mask: torch.Tensor,
               R_c: float, R_w: float) -> torch.Tensor:
    """S_R = R_c P_pos + R_w P_neg over the distinct sampled tokens."""
    p_pos = p[sampled_mask & correct_mask].sum()
    p_neg = p[sampled_mask & ~correct_mask].sum()
    return R_c * p_pos + R_w * p_neg


def token_rewards(correct_mask: torch.Tensor, sampled_mask: torch.Tensor,
                  R_c: float, R_w: float) -> torch.Tensor:
    """R_j: R_c for sampled correct, R_w for sampled wrong, 0 for unsampled tokens."""
    r = torch.where(correct_mask, torch.tensor(float(R_c)), torch.tensor(float(R_w)))
    return torch.where(sampled_mask, r, torch.zeros(())).double()


def logit_step(p: torch.Tensor, correct_mask: torch.Tensor, sampled_mask: torch.Tensor,
               R_c: float, R_w: float, eta: float, N: int) -> torch.Tensor:
    """dz_j = (eta/N) p_j (R_j - S_R) for every token j of the vocabulary."""
    p = p.double()
    s_r = batch_mood(p, correct_mask, sampled_mask, R_c, R_w)
    return (eta / N) * p * (token_rewards(correct_mask, sampled_mask, R_c, R_w) - s_r)


def mass_balance_dq(p: torch.Tensor, correct_mask: torch.Tensor, sampled_mask: torch.Tensor,
                    R_c: float, R_w: float, eta: float, N: int) -> dict[str, float]:
    """Theorem 1's first-order change of Q_pos, split into its three terms.

    Returns {"sampled_correct": (eta/N)(R_c - S_R) Q_neg A2 (>= 0),
             "sampled_wrong": (eta/N)(S_R - R_w) Q_pos B2 (>= 0),
             "unsampled_coupling": (eta/N) S_R (Q_pos U_neg2 - Q_neg U_pos2) (any sign),
             "total": their sum, plus the ingredients S_R, Q_pos, A2, B2, U_pos2, U_neg2}.
    """
    p = p.double()
    correct, sampled = correct_mask.bool(), sampled_mask.bool()
    s_r = float(batch_mood(p, correct, sampled, R_c, R_w))
    q_pos = float(p[correct].sum())
    q_neg = 1.0 - q_pos
    p2 = p.pow(2)
    a2 = float(p2[sampled & correct].sum())
    b2 = float(p2[sampled & ~correct].sum())
    u_pos2 = float(p2[~sampled & correct].sum())
    u_neg2 = float(p2[~sampled & ~correct].sum())
    scale = eta / N
    terms = {
        "sampled_correct": scale * (R_c - s_r) * q_neg * a2,
        "sampled_wrong": scale * (s_r - R_w) * q_pos * b2,
        "unsampled_coupling": scale * s_r * (q_pos * u_neg2 - q_neg * u_pos2),
    }
    terms["total"] = sum(terms.values())
    terms.update(S_R=s_r, Q_pos=q_pos, A2=a2, B2=b2, U_pos2=u_pos2, U_neg2=u_neg2)
    return terms
