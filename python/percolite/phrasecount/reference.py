"""A plain-Python reference for phrasecount's counts, and a synthetic corpus to test it on.

:func:`reference_counts` recomputes every count from scratch with the rules
written out directly (it deliberately does not share code with
:mod:`.text`), so a test can compare an incremental engine's counts, and the
fast tokenizer, against it.

:func:`synthetic_corpus` makes deterministic documents whose phrases follow a
Zipf distribution (a few hot phrases occur in many documents, most are rare),
with exact duplicates under different locations.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterable

from .corpus import Document

__all__ = ["reference_counts", "synthetic_corpus"]

_WORD = re.compile(r"[^\W_]+")


def reference_counts(documents: Iterable[Document]) -> dict[str, tuple[int, int]]:
    """``{phrase: (doc_count, total_count)}`` over the unique documents of ``documents``.

    Documents are keyed by location: when a location occurs more than once,
    its last document wins (as if the earlier ones had been edited).
    Locations with identical content are one unique document, counted once.
    ``doc_count`` is the number of unique documents containing the phrase,
    ``total_count`` its occurrences summed over unique documents. Phrases are
    four consecutive words of the lowercased text, words being the matches of
    ``[^\\W_]+``, joined by single spaces.
    """
    content_by_location = {document.location: document.content for document in documents}
    unique_contents = set(content_by_location.values())
    counts: dict[str, tuple[int, int]] = {}
    for content in unique_contents:
        words = _WORD.findall(content.lower())
        phrases_seen_here = set()
        for start in range(len(words) - 3):
            phrase = " ".join(words[start : start + 4])
            doc_count, total_count = counts.get(phrase, (0, 0))
            if phrase not in phrases_seen_here:
                phrases_seen_here.add(phrase)
                doc_count += 1
            counts[phrase] = (doc_count, total_count + 1)
    return counts


# Words are made of these syllables, so every word is distinct and pronounceable;
# two accented vowels make the corpus exercise non-ASCII letters.
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiouéø"]


def _word(rank: int) -> str:
    """A distinct word for each rank >= 0 (at least two syllables)."""
    syllables = []
    rank += len(_SYLLABLES)  # start at two syllables
    while rank:
        rank, digit = divmod(rank, len(_SYLLABLES))
        syllables.append(_SYLLABLES[digit])
    return "".join(reversed(syllables))


def _zipf_cumulative_weights(n: int, exponent: float) -> list[float]:
    return list(itertools.accumulate(1.0 / rank**exponent for rank in range(1, n + 1)))


def synthetic_corpus(
    n_docs: int,
    seed: int = 0,
    *,
    duplicates: float = 0.05,
    words_per_doc: tuple[int, int] = (100, 300),
    vocabulary_size: int = 20_000,
    phrase_table_size: int = 50_000,
    zipf_exponent: float = 1.0,
) -> list[Document]:
    """``n_docs`` deterministic documents located at ``synthetic:00000``, ``synthetic:00001``...

    Each document is a sequence of four-word phrases drawn from a table of
    ``phrase_table_size`` phrases with Zipf weights (the phrase of rank r has
    weight ``1 / r**zipf_exponent``); the table's words are themselves drawn
    from a Zipf-weighted vocabulary. Phrases are separated by a space, a comma
    or a full stop, and some start with a capital letter, so the text needs
    the real word rules. A document has about ``words_per_doc`` words
    (uniform between the bounds, rounded down to whole phrases).

    A ``duplicates`` fraction of the documents (after the first) are exact
    copies of an earlier document's content under their own location. The
    same arguments always give the same documents, quickly enough to make
    a benchmark's corpus on the spot.
    """
    if not 0.0 <= duplicates <= 1.0:
        raise ValueError(f"duplicates must be a fraction in [0, 1], got {duplicates!r}")
    low, high = words_per_doc
    if not 4 <= low <= high:
        raise ValueError(
            f"words_per_doc must be (low, high) with 4 <= low <= high, got {low, high}"
        )
    rng = random.Random(seed)
    vocabulary = [_word(rank) for rank in range(vocabulary_size)]
    table_words = rng.choices(
        vocabulary,
        cum_weights=_zipf_cumulative_weights(vocabulary_size, zipf_exponent),
        k=4 * phrase_table_size,
    )
    table = [" ".join(table_words[i : i + 4]) for i in range(0, len(table_words), 4)]
    # Phrase-initial capital letters: the same phrase appears in two spellings.
    table += [phrase.capitalize() for phrase in table]
    phrase_weights = _zipf_cumulative_weights(phrase_table_size, zipf_exponent)
    # Cumulative weights again: a capitalized spelling is a quarter as likely as the plain one.
    capitalized_weights = [phrase_weights[-1] + 0.25 * weight for weight in phrase_weights]
    table_weights = phrase_weights + capitalized_weights
    separators = [" ", " ", " ", ", ", ". "]

    documents: list[Document] = []
    for index in range(n_docs):
        location = f"synthetic:{index:05d}"
        if documents and rng.random() < duplicates:
            original = documents[rng.randrange(len(documents))]
            documents.append(Document(location, original.content))
            continue
        n_phrases = rng.randint(low, high) // 4
        chosen = rng.choices(table, cum_weights=table_weights, k=n_phrases)
        joints = rng.choices(separators, k=n_phrases)
        joints[-1] = "."
        content = "".join(itertools.chain.from_iterable(zip(chosen, joints, strict=True)))
        documents.append(Document(location, content))
    return documents
