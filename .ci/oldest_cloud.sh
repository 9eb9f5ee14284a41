#!/usr/bin/env bash
# The gs:// and az:// tests against the OLDEST clients the [gcs] and [azure] extras allow
# (requirements/oldest-cloud.in: google-cloud-storage and azure-storage-blob at
# pyproject.toml's lower bounds, and urllib3 1.26: both clients take it, and
# atomic_ckpt/remote/_http.py has a 1.26 path), in a venv of their own with '.[gcs,azure]' and nothing
# else (no torch, no s3fs, no moto: the S3 tests skip), pinned by
# requirements/oldest-cloud.txt, against the same emulators (fake-gcs-server from its
# wheel, Azurite from tests/remote/emulators, which .ci/run installed before). The main
# run (.ci/run's pytest) covers the newest. The slow tier (SIGKILLed writers) is left to
# the main run: it tests the protocol, not the client's range.
#
#   bash .ci/oldest_cloud.sh               # install into a temporary venv, test, remove it
#   bash .ci/oldest_cloud.sh install VENV  # .ci/run: install beside the main install,
#   bash .ci/oldest_cloud.sh test VENV     #   test after the main run's tiers
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

install() {
  python -m venv "$1"
  "$1/bin/python" -m pip install -q --no-compile -c requirements/oldest-cloud.txt \
    -r requirements/oldest-cloud.in -e '.[gcs,azure]'
  echo "oldest clients ($((SECONDS - started)) s): installed" \
    "$("$1/bin/python" -m pip freeze | grep -i -E '^(google-cloud-storage|google-resumable-media|google-api-core|azure-storage-blob|azure-core|urllib3)==' | tr '\n' ' ')"
}

run_tests() {
  unset PYTHONPATH
  # The pin's purpose: _http.py's urllib3 1.26 path runs here (the main run has 2.x).
  "$1/bin/python" -c 'import sys, urllib3; sys.exit(not urllib3.__version__.startswith("1.26."))' ||
    { echo "oldest clients: urllib3 is not 1.26 (requirements/oldest-cloud.txt)" >&2; exit 1; }
  # The client-facing tests: every store request, its errors, its checksums and the options
  # (the racing writer processes test the protocol, not the client: the main run has them).
  # CI=true (as .ci/run runs): a missing client or emulator fails instead of skipping.
  CI=${CI:-true} "$1/bin/python" -m pytest -q -p no:cacheprovider \
    tests/remote/test_cloud.py tests/remote/test_cloud_faults.py tests/remote/test_cloud_options.py \
    tests/remote/test_cloud_attack_fixes.py tests/remote/test_cloud_reach.py \
    tests/remote/test_cloud_deadline.py \
    -k "not racing"
  echo "oldest clients ($((SECONDS - started)) s): done"
}

case "${1:-}" in
  install) install "$2" ;;
  test) run_tests "$2" ;;
  "")
    work=$(mktemp -d "${TMPDIR:-/tmp}/atomic_ckpt-oldest-cloud.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    install "$work/venv"
    run_tests "$work/venv"
    ;;
  *)
    echo "usage: bash .ci/oldest_cloud.sh [install VENV | test VENV]" >&2
    exit 2
    ;;
esac
