"""`string_check` and `text_similarity`: deterministic graders that run no tenant code.

Each metric is a well-kept library's, not a re-implementation: rapidfuzz (fuzzy_match, its
WRatio scaled to [0, 1]), nltk (sentence BLEU with smoothing method 1 so that short texts
do not score 0 for lacking 4-grams, sentence GLEU), rouge-score (ROUGE-1..5 and ROUGE-L
F-measure, with its default tokenizer), nltk's METEOR over WordNet 3.0. Texts are split on
whitespace for nltk (nltk's own tokenizers need data files this service does not ship).
WordNet comes from Debian's `wordnet-base` package (/usr/share/wordnet, or
BRORL_WORDNET_DIR): nltk's downloader cannot run here, and PyPI has no package of nltk's
WordNet corpus. That package lacks one small file nltk's reader wants, `lexnames` (the 45
lexicographer file names of the WordNet format, lexnames(5WN)); `_WordNet` serves it from
`LEXNAMES` below. Without WordNet data `meteor` is refused, and `cosine` always is (it needs
an embedding model, none is configured), with a clear message before a job is queued.
"""
from __future__ import annotations

import functools
import io
import os
import warnings
from typing import Callable

from trainer.graders.schemas import StringCheckGrader, TextSimilarityGrader
from trainer.graders.settings import grader_settings


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


# WordNet 3.0's lexicographer files, in lex_filenum order (lexnames(5WN)); the syntactic
# category (1 noun, 2 verb, 3 adjective, 4 adverb) follows from the prefix.
LEXNAMES = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute "
    "noun.body noun.cognition noun.communication noun.event noun.feeling noun.food "
    "noun.group noun.location noun.motive noun.object noun.person noun.phenomenon "
    "noun.plant noun.possession noun.process noun.quantity noun.relation noun.shape "
    "noun.state noun.substance noun.time verb.body verb.change verb.cognition "
    "verb.communication verb.competition verb.consumption verb.contact verb.creation "
    "verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative "
    "verb.weather adj.ppl").split()
_CATEGORY = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}


def wordnet_dir() -> str | None:
    """A folder with WordNet 3.0's database files, or None."""
    for folder in (grader_settings().wordnet_dir, "/usr/share/wordnet"):
        if folder and os.path.isfile(os.path.join(folder, "data.noun")):
            return folder
    return None


@functools.lru_cache(maxsize=1)
def _wordnet():
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    folder = wordnet_dir()
    if folder not in nltk.data.path:
        nltk.data.path.append(folder)  # nltk reads corpora only under its data paths
    table = "".join(f"{i:02d}\t{name}\t{_CATEGORY[name.split('.')[0]]}\n"
                    for i, name in enumerate(LEXNAMES))

    class _WordNet(WordNetCorpusReader):
        def open(self, fileid):
            if fileid == "lexnames" and not os.path.exists(os.path.join(folder, fileid)):
                return io.StringIO(table)
            return super().open(fileid)

        def map_wn(self, version="wordnet"):
            # nltk maps other WordNet versions onto its downloaded 3.0 corpus (for the
            # multilingual data); this reader is 3.0 itself and has no multilingual data.
            return None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "multilingual functions are not available"
        return _WordNet(folder, None)


def _meteor(text: str, reference: str) -> float:
    from nltk.translate.meteor_score import meteor_score

    hyp, ref = text.split(), reference.split()
    if not hyp or not ref:
        return float(hyp == ref)
    return float(meteor_score([ref], hyp, wordnet=_wordnet()))


METRICS: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": _fuzzy, "bleu": _bleu, "gleu": _gleu, "meteor": _meteor,
    **{f"rouge_{n}": _rouge(f"rouge{n}") for n in range(1, 6)},
    "rouge_l": _rouge("rougeL"),
}
UNSUPPORTED = {
    "cosine": "evaluation_metric 'cosine' needs an embedding model, and none is configured "
              "on this deployment; use fuzzy_match, bleu, gleu or rouge_*",
}


def check_metric(metric: str) -> None:
    """UnsupportedMetric when this deployment cannot compute `metric`."""
    if metric in UNSUPPORTED:
        raise UnsupportedMetric(UNSUPPORTED[metric])
    if metric == "meteor" and wordnet_dir() is None:
        raise UnsupportedMetric(
            "evaluation_metric 'meteor' needs WordNet data (Debian's wordnet-base package, "
            "or BRORL_WORDNET_DIR), which this deployment lacks; use bleu, gleu, rouge_* or "
            "fuzzy_match")


def text_similarity(grader: TextSimilarityGrader, text: str, reference: str) -> float:
    """The metric's score in [0, 1] (the reward; pass_threshold marks a pass, see `passed`)."""
    check_metric(grader.evaluation_metric)
    return min(1.0, max(0.0, METRICS[grader.evaluation_metric](text, reference)))


def passed(grader: TextSimilarityGrader, score: float) -> bool:
    return score >= grader.pass_threshold
