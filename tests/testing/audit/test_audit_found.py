"""What the crash table's audit found in the library, each pinned by an audit of its own.

A root (or the directory of a single-file checkpoint) that someone else created (Hugging
Face ``Trainer`` makes its ``output_dir``, Lightning's ``ModelCheckpoint`` its ``dirpath``,
both with a plain ``makedirs``) has an entry in its parent that nothing made durable: a
power loss could take the whole directory, and every checkpoint committed into it, even
after the commit returned.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _audit_scripts import needs_strace, script

from atomic_ckpt.testing import audit

pytestmark = needs_strace

INTO_A_FOREIGN_DIRECTORY = """\
# The directory is made by "the framework" (plain makedirs, never fsynced), then one save
# through the library; "returned" is recorded durably in a directory of its own afterwards.
import os, sys
from atomic_ckpt import CheckpointDir, atomic_write
root, how = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(root, "journal"))
fd = os.open(root, os.O_RDONLY); os.fsync(fd); os.close(fd)
ckpt = os.path.join(root, "ckpt")
os.makedirs(ckpt)
if how == "commit":
    with CheckpointDir(ckpt).commit(1) as path:
        (path / "model.bin").write_bytes(b"m" * 5000)
else:
    with atomic_write(os.path.join(ckpt, "model.bin")) as tmp:
        tmp.write_bytes(b"m" * 5000)
open(os.path.join(root, "journal", "returned"), "w").close()
fd = os.open(os.path.join(root, "journal"), os.O_RDONLY); os.fsync(fd); os.close(fd)
"""


def returned_save_survives(root: Path) -> None:
    """Once the save returned, its checkpoint is there, whole."""
    if (root / "journal" / "returned").exists():
        model = root / "ckpt" / "1" / "model.bin"
        if not model.exists():
            model = root / "ckpt" / "model.bin"
        assert model.exists(), "the save returned, but its checkpoint is gone"
        assert model.read_bytes() == b"m" * 5000


@pytest.mark.parametrize("how", ["commit", "atomic_write"])
def test_a_save_into_a_directory_someone_else_created_survives_a_power_loss(
    tmp_path: Path, how: str
) -> None:
    """CheckpointDir.commit() and atomic_write() into an existing, never-fsynced
    directory: once the save returned, no power loss takes it back."""
    root = tmp_path / "run"
    report = audit(
        [*script(tmp_path, "foreign.py", INTO_A_FOREIGN_DIRECTORY), str(root), how],
        returned_save_survives,
        root=root,
    )
    assert report.ok, report.render()
