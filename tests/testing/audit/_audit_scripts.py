"""Tiny workloads and checks for the audit tests: plain Python scripts, two saves each.

Two saves are enough for every property the tests prove (the second save lands beside a
finished first one, which a resume must still find whole), and the crash states grow
faster than the saves: naive 127 distinct states, not 359 with three; marker 187, not 483;
commit() 129, not 190. Each state is one check, so this is most of the audit tests' time.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

needs_strace = pytest.mark.skipif(
    shutil.which("strace") is None,
    reason="the audit records with strace, which is not installed (apt-get install strace)",
)

NAIVE = """\
# A naive trainer: each checkpoint's files written straight into ROOT/<step>/.
import json, os, sys
root = sys.argv[1]
for step in (1, 2):
    d = os.path.join(root, str(step))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "weights.bin"), "wb") as f:
        f.write(bytes([step]) * 4096)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"step": step, "size": 4096}, f)
"""

MARKER = """\
# Files into ROOT/<step>/, then a COMPLETE marker: safe from a kill, nothing fsynced.
import json, os, sys
root = sys.argv[1]
for step in (1, 2):
    d = os.path.join(root, str(step))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "weights.bin"), "wb") as f:
        f.write(bytes([step]) * 4096)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"step": step, "size": 4096}, f)
    open(os.path.join(d, "COMPLETE"), "w").close()
"""

COMMITTED = """\
# The same saves, each committed atomically through CheckpointDir.commit().
import json, sys
from atomic_ckpt import CheckpointDir
ckpts = CheckpointDir(sys.argv[1])
for step in (1, 2):
    with ckpts.commit(step) as path:
        (path / "weights.bin").write_bytes(bytes([step]) * 4096)
        (path / "meta.json").write_text(json.dumps({"step": step, "size": 4096}))
"""

RESUME = """\
# Resume from the newest step directory (with a COMPLETE marker if --marker); exit 1 if broken.
import json, os, sys
root, marked = sys.argv[1], "--marker" in sys.argv
names = os.listdir(root) if os.path.isdir(root) else []
steps = sorted(int(n) for n in names if n.isdigit()
               and (not marked or os.path.exists(os.path.join(root, n, "COMPLETE"))))
if not steps:
    sys.exit(0)
d = os.path.join(root, str(steps[-1]))
meta = json.load(open(os.path.join(d, "meta.json")))
data = open(os.path.join(d, "weights.bin"), "rb").read()
assert data == bytes([meta["step"]]) * meta["size"], "corrupt weights"
"""


def resume_committed(root: Path) -> None:
    """The check of COMMITTED (a forked function): the newest checkpoint loads and is whole."""
    import json

    from atomic_ckpt import CheckpointDir

    latest = CheckpointDir(root).latest()
    if latest is None:
        return
    meta = json.loads((latest.path / "meta.json").read_text())
    data = (latest.path / "weights.bin").read_bytes()
    assert data == bytes([meta["step"]]) * meta["size"], "corrupt weights"


def resume_marked(root: Path) -> None:
    """The check of MARKER (a forked function): the newest marked step is whole."""
    marked = [p for p in root.iterdir() if (p / "COMPLETE").exists()] if root.is_dir() else []
    if marked:
        newest = max(marked, key=lambda p: int(p.name))
        data = (newest / "weights.bin").read_bytes()
        assert data == bytes([int(newest.name)]) * 4096, "corrupt weights"


def script(tmp_path: Path, name: str, text: str) -> list[str]:
    """Write ``text`` to ``tmp_path/name``; the argv that runs it with this Python."""
    path = tmp_path / name
    path.write_text(text)
    return [sys.executable, str(path)]


def check_script(tmp_path: Path, name: str, text: str) -> list[str]:
    """:func:`script` for a check that needs only the standard library (RESUME): run with
    ``-S`` (no site-packages, whose .pth files cost half of each start-up here), as it
    starts once per crash state."""
    path = tmp_path / name
    path.write_text(text)
    return [sys.executable, "-S", str(path)]
