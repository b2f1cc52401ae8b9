"""The word and phrase rules of phrasecount.

* Words are the maximal runs of Unicode letters and digits (the regex
  ``[^\\W_]+``) in the lowercased text: underscores and punctuation split
  words, ``str.lower`` folds case.
* A phrase is ``PHRASE_WORDS`` (four) consecutive words joined by single
  spaces; a text with fewer words has no phrases.

These functions run over every document (the whole standard library for the
built-in corpus), so they stay in C-implemented calls: one regex scan, then
``zip`` over shifted word lists.
"""

from __future__ import annotations

import re
from collections import Counter

__all__ = ["PHRASE_WORDS", "words", "phrases"]

PHRASE_WORDS = 4

_WORD = re.compile(r"[^\W_]+")


def words(text: str) -> list[str]:
    """The words of ``text``, in order: runs of letters and digits of ``text.lower()``."""
    return _WORD.findall(text.lower())


def phrases(text: str) -> Counter[str]:
    """How many times each phrase (``PHRASE_WORDS`` consecutive words) occurs in ``text``."""
    word_list = words(text)
    shifted = [word_list[i:] for i in range(PHRASE_WORDS)]
    return Counter(map(" ".join, zip(*shifted, strict=False)))
