"""phrasecount: counts of four-word phrases over a set of documents, kept up to date.

Engine-independent parts: ``text`` (the word and phrase rules), ``corpus``
(documents from the Python standard library's docstrings or from files) and
``reference`` (a plain-Python reference count and a synthetic Zipf corpus).
"""
