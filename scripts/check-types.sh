#!/usr/bin/env bash
# The typed API, checked against the installed package (make install first):
# - basedpyright --verifytypes: the share of percolite's public symbols whose
#   types are known must be at least MIN_COMPLETENESS;
# - mypy --strict on tests/typing/, user programs written like the README's
#   example, with annotated observers and change handlers: no errors.
set -euo pipefail
cd "$(dirname "$0")/.."
MIN_COMPLETENESS=0.95
# basedpyright finds the installed package through the first python on PATH.
export PATH="$PWD/.venv/bin:$PATH"
# The report goes through a file: it is larger than one argument may be.
report=$(mktemp)
trap 'rm -f "$report"' EXIT
(cd /tmp && basedpyright --verifytypes percolite --ignoreexternal --outputjson >"$report" || true)
python - "$MIN_COMPLETENESS" "$report" <<'PY'
import json, sys
minimum = float(sys.argv[1])
with open(sys.argv[2]) as f:
    report = json.load(f)
completeness = report["typeCompleteness"]
score = completeness["completenessScore"]
print(f"check-types: basedpyright --verifytypes percolite: {score:.1%} of "
      f"{completeness['exportedSymbolCounts']['withKnownType'] + completeness['exportedSymbolCounts']['withUnknownType'] + completeness['exportedSymbolCounts']['withAmbiguousType']} "
      f"exported symbols have known types (at least {minimum:.0%} needed)")
if score < minimum:
    for symbol in completeness["symbols"]:
        if not symbol["isTypeKnown"] and symbol["isExported"]:
            print(f"  unknown: {symbol['name']}")
    sys.exit(1)
PY
mypy --strict --no-incremental tests/typing/
