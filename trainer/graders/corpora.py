"""NLTK's corpora for python graders, offline: where OpenAI's grader image has them, here too.

OpenAI's grader image ships nltk with `punkt`, `stopwords`, `wordnet`, `omw-1.4` and `names`.
nltk's downloader cannot run on this service (no network in a sandbox, none to nltk's hub on
these machines), and PyPI has no package of those corpora one can trust. Two are built here
from Debian's packages instead, in nltk's own layout, under `<sys.prefix>/share/nltk_data`:
a folder nltk searches by default (no NLTK_DATA needed) and inside the Python installation,
which the sandbox binds read-only, so a grader sees it and cannot change it.

- `corpora/wordnet`: WordNet 3.0 from `wordnet-base` (/usr/share/wordnet, or
  BRORL_WORDNET_DIR), copied (28 MB) plus the `lexnames` file that package lacks.
- `corpora/stopwords`: the Snowball stop-word lists nltk's corpus was made from (its README
  says so), one file per language, from Perl's Lingua::StopWords (`liblingua-stopwords-perl`,
  15 languages; its English list of 174 words has the contractions nltk's adds to Snowball's)
  and PostgreSQL's `tsearch_data/*.stop` (the server package) for languages Lingua lacks.
  They are close to nltk's lists, not identical (docs/graders.md says so).

`python -m trainer.graders.corpora` builds them (`make install` runs it); building again
replaces them. `punkt`, `omw-1.4` and `names` have no source here and are not built.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import sys
from pathlib import Path

from trainer.graders.similarity import LEXNAMES, _CATEGORY, wordnet_dir

LINGUA = "/usr/share/perl5/Lingua/StopWords"
LINGUA_LANGUAGES = {
    "DA": "danish", "DE": "german", "EN": "english", "ES": "spanish", "FI": "finnish",
    "FR": "french", "HU": "hungarian", "ID": "indonesian", "IT": "italian", "NL": "dutch",
    "NO": "norwegian", "PT": "portuguese", "RO": "romanian", "RU": "russian", "SV": "swedish"}


def nltk_data_dir() -> Path:
    """Where the corpora go: on nltk's default search path, inside the Python installation."""
    return Path(sys.prefix) / "share" / "nltk_data"


def _postgres_stop_lists() -> dict[str, list[str]]:
    folders = sorted(glob.glob("/usr/share/postgresql/*/tsearch_data"),
                     key=lambda p: [int(x) for x in re.findall(r"\d+", p)] or [0])
    if not folders:
        return {}
    out = {}
    for path in sorted(glob.glob(os.path.join(folders[-1], "*.stop"))):
        words = Path(path).read_text(encoding="utf-8").split()
        if words:
            out[Path(path).stem] = words
    return out


def _lingua_stop_lists() -> dict[str, list[str]]:
    out = {}
    for code, language in LINGUA_LANGUAGES.items():
        path = Path(LINGUA) / f"{code}.pm"
        if not path.is_file():
            continue
        # The list is the `qw( ... )` that `_stopwords` returns.
        found = re.search(r"sub _stopwords\s*\{\s*return qw\((.*?)\)",
                          path.read_text(encoding="utf-8"), re.S)
        if found and found.group(1).split():
            out[language] = found.group(1).split()
    return out


def stop_lists() -> dict[str, list[str]]:
    """Language -> Snowball stop words: Lingua::StopWords' lists (its English one has the
    contractions nltk's has), PostgreSQL's for the languages Lingua lacks."""
    return {**_postgres_stop_lists(), **_lingua_stop_lists()}


def build(target: Path | None = None) -> dict[str, str]:
    """Build the corpora under `target` (default `nltk_data_dir()`); corpus -> what was done."""
    target = target or nltk_data_dir()
    done = {}
    wordnet = target / "corpora" / "wordnet"
    source = wordnet_dir()
    if source is not None:
        shutil.rmtree(wordnet, ignore_errors=True)
        wordnet.mkdir(parents=True)
        for name in sorted(os.listdir(source)):
            path = os.path.join(source, name)
            if os.path.isfile(path):
                # Copied: nltk (3.10's pathsec) refuses a symlink out of the corpus folder
                # and a multiply-linked file alike.
                shutil.copyfile(path, wordnet / name)
        if not (wordnet / "lexnames").exists():
            (wordnet / "lexnames").write_text(
                "".join(f"{i:02d}\t{n}\t{_CATEGORY[n.split('.')[0]]}\n"
                        for i, n in enumerate(LEXNAMES)))
        done["wordnet"] = f"copied from {source}"
        if not (wordnet / "index.sense").exists():
            done["wordnet"] += (" (without index.sense, nltk.corpus.wordnet cannot load: "
                                "install Debian's wordnet-sense-index)")
    else:
        done["wordnet"] = "skipped: no WordNet 3.0 (install Debian's wordnet-base)"
    lists = stop_lists()
    stopwords = target / "corpora" / "stopwords"
    if lists:
        shutil.rmtree(stopwords, ignore_errors=True)
        stopwords.mkdir(parents=True)
        for language, words in sorted(lists.items()):
            (stopwords / language).write_text("\n".join(words) + "\n", encoding="utf-8")
        (stopwords / "README").write_text(
            "Snowball stop-word lists, built by trainer/graders/corpora.py from Debian's "
            "packages.\n")
        done["stopwords"] = f"{len(lists)} languages"
    else:
        done["stopwords"] = ("skipped: no Snowball lists (install postgresql or "
                             "liblingua-stopwords-perl)")
    return done


def available() -> list[str]:
    """The corpora present where nltk will look in a sandbox."""
    root = nltk_data_dir() / "corpora"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


if __name__ == "__main__":
    for corpus, what in build().items():
        print(f"nltk corpus {corpus}: {what} ({nltk_data_dir()})")
