"""The one-file primitives as a user calls them, checked by `mypy --strict`.

Type-checked (never run) by tests/typing/test_typing.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import assert_type

from atomic_ckpt import (
    atomic_write,
    clean_temporaries,
    commit_directory,
    remove_directory,
    remove_file,
    replace_symlink,
    temp_name,
    write_bytes_atomic,
)


def save(directory: Path, payload: bytes) -> None:
    with atomic_write(directory / "model.ckpt", parents=True) as tmp:
        assert_type(tmp, Path)
        tmp.write_bytes(payload)
    assert_type(write_bytes_atomic(directory / "meta.json", b"{}", durable=False), Path)
    assert_type(replace_symlink("model.ckpt", directory / "last.ckpt"), Path)
    assert_type(remove_file(directory / "old.ckpt", missing_ok=False), bool)
    staging = directory / temp_name("sharded.ckpt")
    assert_type(temp_name("x"), str)
    assert_type(commit_directory(staging, directory / "sharded.ckpt"), Path)
    assert_type(remove_directory(directory / "sharded.ckpt"), bool)
    assert_type(clean_temporaries(directory), list[Path])
