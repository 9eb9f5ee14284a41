#!/usr/bin/env bash
# tests/integrations against the OLDEST framework versions the integrations support
# (requirements/oldest.in: transformers, Accelerate, Lightning; torch 2.13.0, the one torch
# tested), in a venv of their own: '.[transformers,accelerate,lightning]' installed next to
# them, pinned by requirements/oldest.txt. The main run (.ci/run's pytest) covers the newest.
# An UntestedVersionWarning is an error here: the oldest must be inside every TESTED_RANGE.
# The DeepSpeed recipe is left to the main run (it tests DeepSpeed, not the oldest range).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d "${TMPDIR:-/tmp}/atomic_ckpt-oldest.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$SECONDS

python -m venv "$work/venv"
# --no-compile: byte-compiling all of torch would double the install time.
"$work/venv/bin/python" -m pip install -q --no-compile -c requirements/oldest.txt \
  -r requirements/oldest.in -e '.[transformers,accelerate,lightning]'
echo "oldest ($((SECONDS - started)) s): installed" \
  "$("$work/venv/bin/python" -m pip freeze | grep -i -E '^(torch|transformers|accelerate|lightning|pytorch-lightning)==' | tr '\n' ' ')"

unset PYTHONPATH
# -m "": both tiers (the integrations' multi-process kills are in the slow tier), on
# pyproject.toml's -n auto workers.
"$work/venv/bin/python" -m pytest tests/integrations -q -p no:cacheprovider -m "" \
  --ignore=tests/integrations/transformers/test_hf_deepspeed.py \
  -W error::atomic_ckpt.integrations.UntestedVersionWarning
echo "oldest ($((SECONDS - started)) s): done"
