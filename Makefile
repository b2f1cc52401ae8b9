# The two set-up commands of the README. Each installs what it needs first.
PY := .venv/bin/python

.PHONY: demo test install bench lint api-docs clean

install:
	scripts/bootstrap.sh

# The main job: phrase counts of the standard library's docstrings, exported to
# build/demo/phrasecount.db.phrases.sqlite. Run it again: only changes are processed.
demo: install
	mkdir -p build/demo
	$(PY) -m percolite phrasecount --db build/demo/phrasecount.db

test: install
	scripts/test.sh

bench: install
	$(PY) bench/run.py

# The API reference, from the docstrings: build/api-docs/index.html.
api-docs: install
	scripts/build-api-docs.sh

lint:
	$(PY) -m ruff check python tests bench scripts notebooks
	clang-format --dry-run --Werror $(shell find cpp tests/cpp -name "*.h" -o -name "*.cc")

clean:
	rm -rf build .venv
