"""Regenerate docs/architecture.md from the modules' docstrings: ``python docs/architecture.py``.

``tests/test_architecture.py`` fails when the table and the code disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import test_architecture as arch  # noqa: E402

INTRO = """\
# The tree, one line per module

Generated from the modules' docstrings by `python docs/architecture.py`;
`tests/test_architecture.py` fails when this table and the code disagree, when a module
imports from a layer above its own, or when the imports form a circle. A module imports only
from its own layer or below: `_core/` layers 1 to 5 in order, then the optional layers
(which use the public API of `atomic_ckpt`), then `cli/`.
"""

SECTIONS = [
    ("The public face", ("=atomic_ckpt", "=atomic_ckpt._version", "atomic_ckpt.torch")),
    ("The core (layers 1-5, `_core/`)", ("=atomic_ckpt._core",)),
    ("Layer 1: names and errors (`_core/l1_names/`)", ("atomic_ckpt._core.l1_",)),
    (
        "Layer 2: the syscall module, locks, checksums (`_core/l2_syscalls/`)",
        ("atomic_ckpt._core.l2_",),
    ),
    ("Layer 3: formats and reading (`_core/l3_formats/`)", ("atomic_ckpt._core.l3_",)),
    ("Layer 4: the protocol (`_core/l4_protocol/`)", ("atomic_ckpt._core.l4_",)),
    ("Layer 5: the facade (`_core/l5_facade/`)", ("atomic_ckpt._core.l5_",)),
    ("Optional layer: multi-rank commit (`distributed/`)", ("atomic_ckpt.distributed",)),
    ("Optional layer: torch DCP (`dcp/`)", ("atomic_ckpt.dcp",)),
    ("Optional layer: object storage (`remote/`)", ("atomic_ckpt.remote",)),
    ("Optional layer: framework integrations (`integrations/`)", ("atomic_ckpt.integrations",)),
    ("Optional layer: crash testing (`testing/`)", ("atomic_ckpt.testing",)),
    ("Front door: the command line (`cli/`)", ("atomic_ckpt.cli",)),
]


def _matches(module: str, keys: tuple[str, ...]) -> bool:
    """``=name`` matches that module alone, ``name_`` is a prefix, ``name`` a package."""
    for k in keys:
        if k.startswith("="):
            if module == k[1:]:
                return True
        elif (
            module.startswith(k)
            if k.endswith("_")
            else module in (k,) or module.startswith(k + ".")
        ):
            return True
    return False


def main() -> None:
    lines = [INTRO]
    done: set[str] = set()
    for title, keys in SECTIONS:
        mods = [m for m in arch.MODULES if m not in done and _matches(m, keys)]
        lines += [f"## {title}", "", "| module | what it owns |", "|---|---|"]
        for m in mods:
            done.add(m)
            path = arch.MODULES[m]
            lines.append(f"| `{path.relative_to(arch.PACKAGE.parent)}` | {arch._summary(path)} |")
        lines.append("")
    missing = set(arch.MODULES) - done
    if missing:
        raise SystemExit(f"no section for {sorted(missing)}")
    (HERE / "architecture.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
