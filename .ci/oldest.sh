#!/usr/bin/env bash
# tests/integrations against the OLDEST framework versions the integrations support
# (requirements/oldest.in: transformers, Accelerate, Lightning; torch 2.13.0, the one torch
# tested), in a venv of their own: '.[transformers,accelerate,lightning]' installed next to
# them, pinned by requirements/oldest.txt. The main run (.ci/run's pytest) covers the newest.
# An UntestedVersionWarning is an error here: the oldest must be inside every TESTED_RANGE.
# The DeepSpeed recipe is left to the main run (it tests DeepSpeed, not the oldest range).
#
#   bash .ci/oldest.sh               # install into a temporary venv, test, remove it
#   bash .ci/oldest.sh install VENV  # .ci/run: install while the main environment installs,
#   bash .ci/oldest.sh test VENV     #   test after the main run's tiers
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

install() {
  python -m venv "$1"
  # --no-compile: byte-compiling all of torch would double the install time.
  "$1/bin/python" -m pip install -q --no-compile -c requirements/oldest.txt \
    -r requirements/oldest.in -e '.[transformers,accelerate,lightning]'
  echo "oldest ($((SECONDS - started)) s): installed" \
    "$("$1/bin/python" -m pip freeze | grep -i -E '^(torch|transformers|accelerate|lightning|pytorch-lightning)==' | tr '\n' ' ')"
}

run_tests() {
  unset PYTHONPATH
  # -m "": both tiers (the integrations' multi-process kills are in the slow tier), on
  # pyproject.toml's -n auto workers.
  "$1/bin/python" -m pytest tests/integrations -q -p no:cacheprovider -m "" \
    --ignore=tests/integrations/transformers/test_hf_deepspeed.py \
    -W error::atomic_ckpt.integrations.UntestedVersionWarning
  echo "oldest ($((SECONDS - started)) s): done"
}

case "${1:-}" in
  install) install "$2" ;;
  test) run_tests "$2" ;;
  "")
    work=$(mktemp -d "${TMPDIR:-/tmp}/atomic_ckpt-oldest.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    install "$work/venv"
    run_tests "$work/venv"
    ;;
  *)
    echo "usage: bash .ci/oldest.sh [install VENV | test VENV]" >&2
    exit 2
    ;;
esac
