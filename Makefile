# The two set-up commands of the README. Each installs what it needs first.
PY := .venv/bin/python

.PHONY: demo test install bench lint clean

install:
	scripts/bootstrap.sh

demo: install
	$(PY) -m percolite demo

test: install
	scripts/test.sh

bench: install
	$(PY) bench/run.py

lint:
	$(PY) -m ruff check python tests bench
	clang-format --dry-run --Werror cpp/include/percolite/*.h cpp/src/* cpp/bindings/*.cc tests/cpp/*

clean:
	rm -rf build .venv
