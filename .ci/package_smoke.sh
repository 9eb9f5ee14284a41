#!/usr/bin/env bash
# Packaging smoke test: build the sdist and the wheel (`python -m build` builds the
# wheel from the sdist, so both are checked), install the wheel into a fresh virtual
# environment and run the installed package away from the source tree. A module left
# out of the wheel, a broken entry point or an import that only works from a checkout
# fails here, loudly, and the whole CI run with it.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/atomic_ckpt-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$SECONDS

say() { echo "package smoke ($((SECONDS - started)) s): $*"; }
fail() {
  echo "package smoke: FAILED: $*" >&2
  exit 1
}

say "building the sdist and the wheel"
python -m pip install -qq build
python -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 \
  || { cat "$work/build.log" >&2; fail "python -m build"; }
shopt -s nullglob
sdists=("$work"/dist/atomic_ckpt-*.tar.gz)
wheels=("$work"/dist/atomic_ckpt-*.whl)
shopt -u nullglob
[ "${#sdists[@]}" = 1 ] || fail "expected one sdist in $work/dist, found: ${sdists[*]:-none}"
[ "${#wheels[@]}" = 1 ] || fail "expected one wheel in $work/dist, found: ${wheels[*]:-none}"
wheel=${wheels[0]}

say "checking that the wheel holds every file of the atomic_ckpt package"
# Subpackages included (e.g. atomic_ckpt/testing/ if testing.py becomes one).
python - "$src/atomic_ckpt" "$wheel" <<'EOF' || fail "the wheel does not hold the whole package"
import sys, zipfile
from pathlib import Path

package, wheel = Path(sys.argv[1]), sys.argv[2]
source = {
    f"atomic_ckpt/{p.relative_to(package).as_posix()}"
    for p in package.rglob("*")
    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
}
packed = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("atomic_ckpt/")}
missing, extra = sorted(source - packed), sorted(packed - source)
for name in missing:
    print(f"  missing from the wheel: {name}", file=sys.stderr)
for name in extra:
    print(f"  in the wheel but not in the source: {name}", file=sys.stderr)
if missing or extra or "atomic_ckpt/py.typed" not in packed:
    sys.exit(1)
print(f"  {len(packed)} files, py.typed included")
EOF

say "installing the wheel into a fresh virtual environment"
python -m venv "$work/venv"
venv_python=$work/venv/bin/python
# torch first, pinned: 2.13.0 is the CPU build on this disk (an unpinned torch would
# pull a CUDA build); the demo needs it and safetensors (the [torch] extra).
# --no-compile: byte-compiling all of torch would double the install time.
"$venv_python" -m pip install -qq --no-compile torch==2.13.0 \
  || fail "pip install torch==2.13.0 in the venv"
"$venv_python" -m pip install -qq "${wheel}[torch]" \
  || fail "pip install $(basename "$wheel")[torch] in the venv"

# Away from the source tree: from an empty directory, nothing added to sys.path.
mkdir "$work/run"
cd "$work/run"
unset PYTHONPATH
export PYTHONNOUSERSITE=1

version=$(basename "$wheel" | cut -d- -f2)
say "atomic-ckpt --version"
out=$("$work/venv/bin/atomic-ckpt" --version) || fail "atomic-ckpt --version"
echo "  $out"
[ "$out" = "atomic-ckpt $version" ] || fail "atomic-ckpt --version printed '$out', not 'atomic-ckpt $version'"

say "atomic-ckpt demo --steps 3"
"$work/venv/bin/atomic-ckpt" demo "$work/demo" --steps 3 >"$work/demo.log" 2>&1 \
  || { cat "$work/demo.log" >&2; fail "atomic-ckpt demo --steps 3"; }
echo "  exited 0 after $(wc -l <"$work/demo.log") lines of output"

say "import atomic_ckpt.testing from the venv's site-packages"
"$venv_python" - "$src" <<'EOF' || fail "import atomic_ckpt.testing from the installed wheel in the venv"
import sys
from pathlib import Path

import atomic_ckpt
import atomic_ckpt.testing

src, venv = Path(sys.argv[1]).resolve(), Path(sys.prefix).resolve()
assert sys.prefix != sys.base_prefix, f"{sys.executable} is not running in a venv"
for module in (atomic_ckpt, atomic_ckpt.testing):
    where = Path(module.__file__).resolve()
    assert venv in where.parents, f"{module.__name__} came from {where}, not from {venv}"
    assert src not in where.parents, f"{module.__name__} came from the source tree: {where}"
print(f"  {atomic_ckpt.testing.__name__} from {Path(atomic_ckpt.testing.__file__).parent}")
EOF

say "passed in $((SECONDS - started)) s"
