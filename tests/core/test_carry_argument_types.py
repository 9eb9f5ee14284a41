"""``commit(step, carry=...)`` takes a mapping of relative paths to the checkpoint each
comes from; a list or a lone string (``carry=["tokenizer/"]``) is refused with a
``TypeError`` that names the option and its form, not a bare ``AttributeError``."""

from __future__ import annotations

import os

import pytest

from atomic_ckpt import CheckpointDir


@pytest.mark.parametrize("carry", [["f.bin"], "f.bin"], ids=["list", "str"])
def test_carry_that_is_no_mapping_is_a_type_error_naming_it(
    ckpts: CheckpointDir, carry: object
) -> None:
    """TypeError mentioning ``carry``; nothing is left beside the checkpoints."""
    with ckpts.commit(1) as path:
        (path / "f.bin").write_bytes(b"f" * 100)

    def save() -> None:
        with ckpts.commit(2, carry=carry) as path:  # type: ignore[arg-type]
            (path / "t.bin").write_bytes(b"t")

    with pytest.raises(TypeError, match="carry"):
        save()
    assert sorted(os.listdir(ckpts.root)) == ["1"]
