"""webindex: the inbound links of web pages, counted and kept up to date.

Engine-independent parts: ``links`` (the URI and link rules, HTML link
extraction), ``inputs`` (directories of HTML files, link records, WARC
files) and ``synthetic`` (a seeded synthetic web). ``app`` is the
percolite application, ``cli`` the ``percolite webindex`` commands.
"""
