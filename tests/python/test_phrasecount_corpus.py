"""phrasecount's engine-independent parts: the word and phrase rules, the corpora, the reference.

The reference (``reference_counts``) is what the phrasecount application's
counts are checked against, so it is itself checked here: on a corpus small
enough to count by hand, and against the fast tokenizer of ``text`` on the
synthetic and standard-library corpora.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections import Counter

import pytest
from percolite.phrasecount.corpus import (
    Document,
    Problem,
    ProblemKind,
    content_id,
    file_documents,
    stdlib_documents,
)
from percolite.phrasecount.reference import reference_counts, synthetic_corpus
from percolite.phrasecount.text import PHRASE_WORDS, phrases, words

# -- words and phrases ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Hello, World!", ["hello", "world"]),
        ("snake_case__name", ["snake", "case", "name"]),  # underscores split words
        ("abc123 4x4 3.14 x²", ["abc123", "4x4", "3", "14", "x²"]),  # digits are word characters
        ("don't re-use e-mail", ["don", "t", "re", "use", "e", "mail"]),
        ("Grüße aus KÖLN", ["grüße", "aus", "köln"]),  # lower(), not casefold(): ß stays
        ("ΣΊΣΥΦΟΣ", ["σίσυφος"]),  # str.lower knows the final sigma
        ("2024年 東京は", ["2024年", "東京は"]),  # no spaces needed between letters and digits
        ("one\ttwo\nthree\u00a0four", ["one", "two", "three", "four"]),
        # No Unicode normalization: a combining mark is not a letter, so it splits.
        ("cafe\u0301s", ["cafe", "s"]),
        ("", []),
        ("... -- !!", []),
    ],
)
def test_words_are_runs_of_letters_and_digits_of_the_lowercased_text(text, expected):
    assert words(text) == expected


def test_phrases_are_four_consecutive_words_joined_by_one_space():
    assert PHRASE_WORDS == 4
    assert phrases("The quick, brown\n\nFOX_jumps") == Counter(
        {"the quick brown fox": 1, "quick brown fox jumps": 1}
    )


def test_phrases_count_repeated_occurrences():
    assert phrases("the cat the cat the cat the") == Counter(
        {"the cat the cat": 2, "cat the cat the": 2}
    )


@pytest.mark.parametrize("text", ["", "one", "one two", "one, two; three!", "a_b_c"])
def test_fewer_than_four_words_have_no_phrases(text):
    assert phrases(text) == Counter()


def test_exactly_four_words_are_one_phrase():
    assert phrases("a_b-c.D") == Counter({"a b c d": 1})


# -- content ids -------------------------------------------------------------------------


def test_content_id_is_the_sha256_of_the_utf8_text():
    assert content_id("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert content_id("héllo") == content_id("héllo")
    assert content_id("héllo") != content_id("hello")
    assert len(content_id("\udc80 a lone surrogate")) == 64  # every str has an id


# -- the reference -----------------------------------------------------------------------

HAND_CHECKED_CORPUS = [
    Document("loc1", "one two three four one two three four"),
    Document("loc2", "one two three four one two three four"),  # same content as loc1
    Document("loc3", "ONE two_three, four!"),
    Document("loc4", "only three words"),
    Document("loc5", "two three four one"),
    Document("loc6", "alpha beta gamma delta"),
    Document("loc7", "ONE two_three, four!"),  # same content as loc3
    Document("loc8", "one two three four"),  # same words as loc3, different text
    Document("loc6", "one two three four five"),  # loc6 edited: the last one counts
]


def test_reference_counts_unique_documents_by_hand():
    # Unique documents: loc1 (= loc2), loc3 (= loc7), loc4, loc5, loc6 (edited), loc8.
    assert reference_counts(HAND_CHECKED_CORPUS) == {
        # twice in loc1, once in loc3, loc6 and loc8
        "one two three four": (4, 5),
        "two three four one": (2, 2),  # loc1, loc5
        "three four one two": (1, 1),  # loc1
        "four one two three": (1, 1),  # loc1
        "two three four five": (1, 1),  # loc6
    }


def test_reference_counts_do_not_change_with_more_locations_of_the_same_content():
    more = [*HAND_CHECKED_CORPUS, *(Document(f"copy{i}", "two three four one") for i in range(5))]
    assert reference_counts(more) == reference_counts(HAND_CHECKED_CORPUS)
    assert reference_counts([]) == {}


def tokenizer_counts(documents):
    """The reference's numbers, computed with the fast tokenizer of ``text``."""
    content_by_location = {document.location: document.content for document in documents}
    doc_counts, total_counts = Counter(), Counter()
    for content in set(content_by_location.values()):
        counts = phrases(content)
        doc_counts.update(counts.keys())
        total_counts.update(counts)
    return {phrase: (doc_counts[phrase], total_counts[phrase]) for phrase in doc_counts}


def test_fast_tokenizer_agrees_with_the_reference_on_the_synthetic_corpus():
    documents = synthetic_corpus(500, seed=3)
    assert tokenizer_counts(documents) == reference_counts(documents)


def test_fast_tokenizer_agrees_with_the_reference_on_the_stdlib_corpus(stdlib_corpus):
    documents = stdlib_corpus.documents
    assert tokenizer_counts(documents) == reference_counts(documents)


# -- the synthetic corpus ----------------------------------------------------------------


def test_synthetic_corpus_is_deterministic():
    first = synthetic_corpus(300, seed=7)
    assert synthetic_corpus(300, seed=7) == first
    assert synthetic_corpus(300, seed=8) != first
    assert [document.location for document in first] == [f"synthetic:{i:05d}" for i in range(300)]


def test_synthetic_corpus_has_duplicates_and_documents_of_the_requested_length():
    documents = synthetic_corpus(2000, seed=1, duplicates=0.05, words_per_doc=(100, 300))
    unique = {document.content for document in documents}
    assert 0.02 * 2000 < len(documents) - len(unique) < 0.10 * 2000
    assert all(100 <= len(words(content)) <= 300 for content in unique)
    no_copies = synthetic_corpus(50, duplicates=0.0)
    assert len({document.content for document in no_copies}) == 50


def test_synthetic_corpus_phrases_are_zipf_skewed():
    documents = synthetic_corpus(2000, seed=1)
    n_unique = len({document.content for document in documents})
    counts = reference_counts(documents)
    by_total = sorted((total for _, total in counts.values()), reverse=True)
    hottest_doc_count = max(doc_count for doc_count, _ in counts.values())
    # A few hot phrases are in most documents; most phrases occur once;
    # the hottest 1% of phrases are a large share of all occurrences.
    assert hottest_doc_count > 0.5 * n_unique
    assert sum(1 for total in by_total if total == 1) > 0.5 * len(by_total)
    top = by_total[: len(by_total) // 100]
    assert sum(top) > 0.25 * sum(by_total)
    # Zipf: frequency falls roughly as 1 / rank among the hottest phrases.
    assert 5 < by_total[0] / by_total[9] < 20


@pytest.mark.parametrize(
    "kwargs", [{"duplicates": 1.5}, {"duplicates": -0.1}, {"words_per_doc": (3, 10)}]
)
def test_synthetic_corpus_refuses_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        synthetic_corpus(10, **kwargs)


# -- the standard-library corpus ---------------------------------------------------------


class StdlibCorpus:
    """One read of the standard-library corpus, and ``sys.modules`` before and after it."""

    def __init__(self):
        # Never imported by pytest or percolite; reading antigravity's docstrings
        # must not import it (importing it would open a web browser).
        self.untouched = ["antigravity", "turtledemo", "idlelib", "this"]
        self.modules_before = set(sys.modules)
        self.problems = []
        self.documents = list(stdlib_documents(self.problems.append))
        self.modules_after = set(sys.modules)


@pytest.fixture(scope="module")
def stdlib_corpus():
    return StdlibCorpus()


def test_stdlib_corpus_has_hundreds_of_modules(stdlib_corpus):
    locations = [document.location for document in stdlib_corpus.documents]
    assert len(locations) >= 200
    assert locations == sorted(locations)
    assert len(set(locations)) == len(locations)
    assert all(location.startswith("stdlib:") for location in locations)
    assert {"stdlib:json", "stdlib:json.decoder", "stdlib:antigravity"} <= set(locations)
    assert stdlib_corpus.problems == []


def test_stdlib_corpus_leaves_out_tests_and_installed_packages(stdlib_corpus):
    modules = [document.location[len("stdlib:") :] for document in stdlib_corpus.documents]
    for module in modules:
        parts = module.split(".")
        assert parts[0] not in ("test", "pip", "setuptools", "_pytest", "pytest"), module
        assert not {"test", "tests", "idle_test"} & set(parts), module


def test_stdlib_corpus_holds_docstrings(stdlib_corpus):
    content = {document.location: document.content for document in stdlib_corpus.documents}
    assert content["stdlib:json"].startswith("JSON (JavaScript Object Notation)")
    assert "Simple JSON" in content["stdlib:json.decoder"]  # class JSONDecoder
    assert all(document.content.strip() for document in stdlib_corpus.documents)


def test_stdlib_corpus_imports_nothing(stdlib_corpus):
    read = {document.location[len("stdlib:") :] for document in stdlib_corpus.documents}
    imported = stdlib_corpus.modules_after - stdlib_corpus.modules_before
    # Reading may load its own machinery: the codec a coding cookie names
    # (encodings.cp1252 for turtledemo.clock) and sysconfig's build data.
    machinery = {name for name in imported if name.startswith(("encodings.", "_sysconfigdata"))}
    assert not (imported - machinery) & read
    for module in stdlib_corpus.untouched:
        assert module not in stdlib_corpus.modules_after


def test_stdlib_corpus_is_deterministic(stdlib_corpus):
    assert list(stdlib_documents()) == stdlib_corpus.documents


FAKE_STDLIB = {
    "pkg/__init__.py": '"""The package."""\n',
    "pkg/mod.py": '''"""Module doc."""
import sys


class Thing:
    """Class doc."""

    def method(self):
        """Method doc."""

        def inner():
            """Inner function doc."""


if sys.platform:

    async def conditional():
        """Async function doc,
            indented continuation."""

lambda: "not a docstring"
x = """not a docstring either"""
''',
    "pkg/nodoc.py": "x = 1\n",
    "pkg.py": '"""Left out: the package pkg/ wins, as in import."""\n',
    "pkg/test/test_mod.py": '"""Left out: a test suite."""\n',
    "pkg/tests/test_mod.py": '"""Left out: a test suite."""\n',
    "test/support.py": '"""Left out: the test package."""\n',
    "site-packages/installed.py": '"""Left out: not a package name."""\n',
    ".hidden/mod.py": '"""Left out: hidden."""\n',
    "not-a-module.py": '"""Left out: not an identifier."""\n',
    "notes.txt": '"""Left out: not Python."""\n',
    "broken.py": 'def f(:\n    """Unparsable."""\n',
}


def test_stdlib_documents_rules_on_a_fake_stdlib(tmp_path):
    for name, source in FAKE_STDLIB.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source, encoding="utf-8")
    (tmp_path / "latin.py").write_bytes(b'# -*- coding: latin-1 -*-\n"""Caf\xe9 doc."""\n')
    problems = []
    documents = list(stdlib_documents(problems.append, root=tmp_path))
    assert documents == [
        Document("stdlib:latin", "Café doc."),
        Document("stdlib:pkg", "The package."),
        Document(
            "stdlib:pkg.mod",
            "Module doc.\n\nClass doc.\n\nMethod doc.\n\nInner function doc.\n\n"
            "Async function doc,\nindented continuation.",
        ),
    ]
    assert [(os.path.basename(p.location), p.kind) for p in problems] == [
        ("broken.py", ProblemKind.UNPARSABLE)
    ]
    with pytest.raises(FileNotFoundError):
        list(stdlib_documents(root=tmp_path / "missing"))


# -- files -------------------------------------------------------------------------------


@contextlib.contextmanager
def fails_after(seconds):
    """Turn a hang (e.g. a blocking open of a FIFO) into a failure, on POSIX."""

    def hang(signum, frame):
        raise AssertionError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


posix_only = pytest.mark.skipif(os.name != "posix", reason="symlinks, FIFOs and modes are POSIX")


def read_files(paths):
    problems = []
    documents = list(file_documents(paths, problems.append))
    return documents, problems


def relative(root, problems):
    return [(os.path.relpath(p.location, root), p.kind) for p in problems]


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / ".hidden").mkdir()
    (root / "a.txt").write_text("Alpha beta gamma delta epsilon", encoding="utf-8")
    (root / "empty.txt").write_text("", encoding="utf-8")
    (root / "sub" / "b.md").write_text("# Heading\n\nbé ta", encoding="utf-8")
    (root / "sub" / "copy_of_a.txt").write_text("Alpha beta gamma delta epsilon", encoding="utf-8")
    (root / "sub" / "deeper" / "c.txt").write_text("c", encoding="utf-8")
    (root / "zz.txt").write_text("last", encoding="utf-8")
    (root / ".hidden" / "x.txt").write_text("hidden", encoding="utf-8")
    (root / ".dotfile").write_text("hidden", encoding="utf-8")
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (root / "latin1.txt").write_bytes(b"caf\xe9 au lait")
    return root


def test_files_are_documents_in_sorted_preorder(tree):
    documents, problems = read_files([tree])
    assert [(os.path.relpath(d.location, tree), d.content) for d in documents] == [
        ("a.txt", "Alpha beta gamma delta epsilon"),
        ("empty.txt", ""),
        ("sub/b.md", "# Heading\n\nbé ta"),
        ("sub/copy_of_a.txt", "Alpha beta gamma delta epsilon"),
        ("sub/deeper/c.txt", "c"),
        ("zz.txt", "last"),
    ]
    assert all(os.path.isabs(d.location) for d in documents)
    assert relative(tree, problems) == [
        ("image.png", ProblemKind.BINARY),
        ("latin1.txt", ProblemKind.NOT_UTF8),
    ]
    assert "offset 3" in problems[1].reason  # the 0xe9 of "caf\xe9"


def test_files_are_deterministic_and_read_once_when_paths_overlap(tree, monkeypatch):
    monkeypatch.chdir(tree.parent)
    documents, _ = read_files([tree])
    again, _ = read_files(["tree/sub", "tree", tree / "a.txt"])
    assert sorted(again) == sorted(documents)
    assert len(again) == len(documents)


@pytest.mark.parametrize(
    "paths",
    [
        ["tree", "tree"],
        ["tree/a.txt", "tree"],
        ["tree/", "tree/sub/"],
        ["tree/sub", "tree/sub", "tree/a.txt", "tree/a.txt"],
    ],
)
def test_each_location_is_read_once_whatever_the_overlap(tree, monkeypatch, paths):
    monkeypatch.chdir(tree.parent)
    locations = [d.location for d in read_files(paths)[0]]
    assert locations and len(locations) == len(set(locations)), locations


def test_roots_overlap_only_when_one_is_given_twice_or_lies_under_another(tmp_path):
    """The walk remembers the locations it met only when roots overlap."""
    from percolite.phrasecount.corpus import _overlapping

    for name in ("x", "xy", "x/z"):
        (tmp_path / name).mkdir()
    (tmp_path / "x" / "f.txt").write_text("f")
    x, xy, z, f = (str(tmp_path / n) for n in ("x", "xy", "x/z", "x/f.txt"))
    assert not _overlapping([x]) and not _overlapping([x, xy]) and not _overlapping([xy, f])
    assert _overlapping([x, x]) and _overlapping([z, x]) and _overlapping([x, f])


def test_a_hidden_path_named_explicitly_is_read(tree):
    documents, problems = read_files([tree / ".hidden", tree / ".dotfile"])
    assert [d.content for d in documents] == ["hidden", "hidden"]
    assert problems == []


def test_missing_paths_are_reported_before_anything_is_read(tree):
    problems = []
    documents = file_documents(
        [tree / "nope", tree / "a.txt" / "child", tree / "a.txt"], problems.append
    )
    assert [(p.kind, p.reason) for p in problems] == [
        (ProblemKind.MISSING_PATH, "no such file or directory"),
        (ProblemKind.MISSING_PATH, "no such file or directory"),
    ]
    assert [d.content for d in documents] == ["Alpha beta gamma delta epsilon"]
    assert str(problems[0]) == f"{tree / 'nope'}: no such file or directory"


@posix_only
def test_links_broken_links_and_loops(tree):
    os.symlink(tree / "a.txt", tree / "link_to_a")
    os.symlink(tree / "sub", tree / "link_to_sub")
    os.symlink(tree / "nowhere", tree / "dangling")
    os.symlink(tree / "loop2", tree / "loop1")
    os.symlink(tree / "loop1", tree / "loop2")
    documents, problems = read_files([tree])
    locations = [os.path.relpath(d.location, tree) for d in documents]
    assert "link_to_a" in locations  # a link to a file is one more location of its content
    assert not any(location.startswith("link_to_sub") for location in locations)
    assert relative(tree, problems) == [
        ("dangling", ProblemKind.UNREADABLE),
        ("image.png", ProblemKind.BINARY),
        ("latin1.txt", ProblemKind.NOT_UTF8),
        ("link_to_sub", ProblemKind.LINK_NOT_FOLLOWED),
        ("loop1", ProblemKind.UNREADABLE),
        ("loop2", ProblemKind.UNREADABLE),
    ]
    assert problems[0].reason == "broken symbolic link"
    # Named as a PATH, a dangling link is a missing path and a linked directory is walked.
    documents, problems = read_files([tree / "dangling", tree / "link_to_sub"])
    assert [(p.kind, p.reason) for p in problems] == [
        (ProblemKind.MISSING_PATH, "broken symbolic link")
    ]
    assert [os.path.relpath(d.location, tree) for d in documents] == [
        "link_to_sub/b.md",
        "link_to_sub/copy_of_a.txt",
        "link_to_sub/deeper/c.txt",
    ]


def test_a_file_removed_after_its_directory_was_listed_is_reported(tree):
    # Root-proof unreadable file: the walk lists tree/ before yielding a.txt,
    # so zz.txt is gone when its turn comes.
    problems = []
    documents = file_documents([tree], problems.append)
    assert next(documents).location == str(tree / "a.txt")
    (tree / "zz.txt").unlink()
    rest = list(documents)
    assert str(tree / "zz.txt") not in [d.location for d in rest]
    assert (str(tree / "zz.txt"), ProblemKind.UNREADABLE) in [
        (p.location, p.kind) for p in problems
    ]


@posix_only
def test_a_fifo_is_skipped_without_blocking(tree):
    os.mkfifo(tree / "sub" / "fifo")
    with fails_after(10):
        documents, problems = read_files([tree / "sub", tree / "sub" / "fifo"])
    assert len(documents) == 3
    assert relative(tree, problems) == [("sub/fifo", ProblemKind.NOT_REGULAR)]


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0, reason="needs POSIX modes and a non-root user"
)
def test_files_and_directories_without_read_permission_are_reported(tree):
    os.chmod(tree / "a.txt", 0)
    os.chmod(tree / "sub", 0)
    try:
        documents, problems = read_files([tree])
    finally:
        os.chmod(tree / "a.txt", 0o644)
        os.chmod(tree / "sub", 0o755)
    assert [os.path.relpath(d.location, tree) for d in documents] == ["empty.txt", "zz.txt"]
    assert relative(tree, problems) == [
        ("a.txt", ProblemKind.UNREADABLE),
        ("image.png", ProblemKind.BINARY),
        ("latin1.txt", ProblemKind.NOT_UTF8),
        ("sub", ProblemKind.UNREADABLE),
    ]
    assert problems[0].reason == "Permission denied"


@pytest.mark.skipif(sys.platform != "linux", reason="Linux file names may be any bytes")
def test_a_file_name_that_is_not_utf8_is_reported(tree):
    descriptor = os.open(os.fsencode(tree / "sub") + b"/caf\xe9.txt", os.O_CREAT | os.O_WRONLY)
    os.close(descriptor)
    documents, problems = read_files([tree / "sub"])
    assert len(documents) == 3
    assert [(p.kind, p.reason) for p in problems] == [
        (ProblemKind.UNREADABLE, "name is not valid UTF-8")
    ]
    assert problems[0].location.endswith("caf\ufffd.txt")
    assert isinstance(problems[0], Problem)
