"""`string_check` and `text_similarity`: deterministic graders that run no tenant code.

Each metric is a well-kept library's, not a re-implementation: rapidfuzz (fuzzy_match, its
WRatio scaled to [0, 1]), nltk (sentence BLEU with smoothing method 1 so that short texts
do not score 0 for lacking 4-grams, sentence GLEU), rouge-score (ROUGE-1..5 and ROUGE-L
F-measure, with its default tokenizer). Texts are split on whitespace for nltk (nltk's own
tokenizers need data files this service does not ship). `meteor` needs WordNet data and
`cosine` an embedding model; neither is configured here, so both are refused with a clear
message (UnsupportedMetric) before a job is queued.
"""
from __future__ import annotations

import functools
from typing import Callable

from trainer.graders.models import StringCheckGrader, TextSimilarityGrader


class UnsupportedMetric(ValueError):
    """A text_similarity metric this deployment cannot compute."""


def string_check(grader: StringCheckGrader, text: str, reference: str) -> float:
    op = grader.operation
    if op == "eq":
        return float(text == reference)
    if op == "ne":
        return float(text != reference)
    if op == "like":
        return float(reference in text)
    return float(reference.lower() in text.lower())


def _fuzzy(text: str, reference: str) -> float:
    from rapidfuzz import fuzz

    return fuzz.WRatio(text, reference) / 100.0


def _bleu(text: str, reference: str) -> float:
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    hyp, ref = text.split(), reference.split()
    if not hyp or not ref:
        return float(hyp == ref)
    return float(sentence_bleu([ref], hyp, smoothing_function=SmoothingFunction().method1))


def _gleu(text: str, reference: str) -> float:
    from nltk.translate.gleu_score import sentence_gleu

    hyp, ref = text.split(), reference.split()
    if not hyp or not ref:
        return float(hyp == ref)
    return float(sentence_gleu([ref], hyp))


@functools.lru_cache(maxsize=8)
def _rouge_scorer(key: str):
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([key], use_stemmer=False)


def _rouge(key: str) -> Callable[[str, str], float]:
    def score(text: str, reference: str) -> float:
        return float(_rouge_scorer(key).score(reference, text)[key].fmeasure)

    return score


METRICS: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": _fuzzy, "bleu": _bleu, "gleu": _gleu,
    **{f"rouge_{n}": _rouge(f"rouge{n}") for n in range(1, 6)},
    "rouge_l": _rouge("rougeL"),
}
UNSUPPORTED = {
    "meteor": "evaluation_metric 'meteor' needs WordNet data, which this deployment does "
              "not ship; use bleu, gleu, rouge_* or fuzzy_match",
    "cosine": "evaluation_metric 'cosine' needs an embedding model, and none is configured "
              "on this deployment; use fuzzy_match, bleu, gleu or rouge_*",
}


def check_metric(metric: str) -> None:
    """UnsupportedMetric when this deployment cannot compute `metric`."""
    if metric in UNSUPPORTED:
        raise UnsupportedMetric(UNSUPPORTED[metric])


def text_similarity(grader: TextSimilarityGrader, text: str, reference: str) -> float:
    """The metric's score in [0, 1] (the reward; pass_threshold marks a pass, see `passed`)."""
    check_metric(grader.evaluation_metric)
    return min(1.0, max(0.0, METRICS[grader.evaluation_metric](text, reference)))


def passed(grader: TextSimilarityGrader, score: float) -> bool:
    return score >= grader.pass_threshold
