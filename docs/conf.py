"""Sphinx configuration for the atomic_ckpt documentation.

Build (offline, warnings as errors)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Why Sphinx + furo + MyST: it is what filelock and structlog (the house's models)
use; autodoc reads the docstrings the package already has (napoleon accepts
either docstring style); MyST lets the guides stay Markdown, so the README's
text moved over unchanged. No intersphinx: the build must not touch the network.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # document this checkout, not an installed copy

import atomic_ckpt  # noqa: E402

project = "atomic_ckpt"
author = "atomic_ckpt developers"
copyright = "atomic_ckpt developers"
release = atomic_ckpt.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

myst_enable_extensions = ["deflist", "colon_fence", "substitution"]
myst_heading_anchors = 3


def _extras() -> dict[str, list[str]]:
    """The optional-dependency lists of pyproject.toml, as pip reads them."""
    import tomllib

    with open(os.path.join(os.path.dirname(HERE), "pyproject.toml"), "rb") as f:
        extras: dict[str, list[str]] = tomllib.load(f)["project"]["optional-dependencies"]
    return extras


def _installed(name: str) -> str:
    """The version of ``name`` in the environment building these pages, or "not installed"."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(name)
    except PackageNotFoundError:
        return "not installed"


def _ci_torch() -> str:
    """The torch that .ci/run installs first (the CPU build CI tests)."""
    with open(os.path.join(os.path.dirname(HERE), ".ci", "run")) as f:
        found = re.search(r"torch==([0-9][0-9.]*)", f.read())
    if found is None:
        raise RuntimeError(".ci/run pins no torch==X: docs/conf.py reads the tested torch there")
    return found[1]


def _range(low: tuple[int, ...] | str, high: tuple[int, ...] | str) -> str:
    def dotted(v: tuple[int, ...] | str) -> str:
        return v if isinstance(v, str) else ".".join(map(str, v))

    return f">={dotted(low)},<{dotted(high)}"


def _tested(tested: Any) -> str:
    """An integration's TESTED_RANGE as the guides state it: the two versions CI runs."""
    newest = ".".join(tested.newest.split(".")[:2])
    return (
        f"{tested.oldest} and {tested.newest} (CI runs the tests against both; any version "
        f"from {tested.oldest} to {newest}.x imports without a warning)"
    )


def _substitutions() -> dict[str, str]:
    """Version facts for the guides, read from the code and pyproject.toml (never typed
    twice): ``{{ name }}`` in a page."""
    from atomic_ckpt import dcp
    from atomic_ckpt.integrations import accelerate, lightning, transformers

    extras = _extras()
    subs = {
        "ci_torch": _ci_torch(),
        "range_transformers": _tested(transformers.TESTED_RANGE),
        "range_accelerate": _tested(accelerate.TESTED_RANGE),
        "range_lightning": _tested(lightning.TESTED_RANGE),
        "range_dcp_torch": _range(*dcp.TESTED_TORCH),
    }
    for extra, requirements in extras.items():
        subs[f"extra_{extra}"] = ", ".join(f"`{r}`" for r in requirements)
        for r in requirements:  # req_<name>: one requirement, wherever it is declared
            name = re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("-", "_")
            subs.setdefault(f"req_{name}", f"`{r}`")
    for dist in (
        "torch",
        "transformers",
        "accelerate",
        "lightning",
        "pytorch-lightning",
        "deepspeed",
        "fsspec",
        "s3fs",
        "google-cloud-storage",
        "azure-storage-blob",
        "safetensors",
    ):
        subs["built_" + dist.replace("-", "_")] = _installed(dist)
    return subs


myst_substitutions = _substitutions()

html_theme = "furo"
html_title = f"atomic_ckpt {release}"

autodoc_default_options: dict[str, Any] = {
    "members": True,
    "show-inheritance": True,
}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# Nothing is mocked: autodoc imports every public module, so the docs extra installs the
# frameworks the integrations need (and CI has them all).


def _public_target(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve ``atomic_ckpt._private.Name`` (how annotations spell a re-exported class)
    to the public name the API pages document (``atomic_ckpt.Name``, or the one public
    module that documents it), so signatures link to the reference."""
    if node.get("refdomain") != "py":
        return None
    target: str = node.get("reftarget", "")
    if not target.startswith("atomic_ckpt.") or "._" not in "." + target:
        return None
    name = target.rsplit(".", 1)[-1]
    py = env.get_domain("py")
    matches = [
        full
        for full in py.objects
        if full.rsplit(".", 1)[-1] == name and not any(p.startswith("_") for p in full.split("."))
    ]
    if not matches:
        return None
    matches.sort(key=len)  # atomic_ckpt.Name before atomic_ckpt.remote.Name
    return py.resolve_xref(
        env,
        node.get("refdoc"),
        app.builder,
        node.get("reftype", "class"),
        matches[0],
        node,
        contnode,
    )


PUBLIC_MODULES = [
    "atomic_ckpt",
    "atomic_ckpt.torch",
    "atomic_ckpt.distributed",
    "atomic_ckpt.dcp",
    "atomic_ckpt.remote",
    "atomic_ckpt.testing",
    "atomic_ckpt.testing.dcp",
    "atomic_ckpt.integrations.transformers",
    "atomic_ckpt.integrations.accelerate",
    "atomic_ckpt.integrations.lightning",
]
"""Every public module; each name in its ``__all__`` must be on an API page."""


def _check_documented(app: Any, env: Any) -> None:
    """Warn (an error under ``-W``) for a public name no API page documents, so a name
    added to an ``__all__`` cannot be left out of the reference."""
    import importlib

    from sphinx.util import logging as sphinx_logging

    log = sphinx_logging.getLogger(__name__)
    documented = set(env.get_domain("py").objects)
    for modname in PUBLIC_MODULES:
        module = importlib.import_module(modname)
        for name in getattr(module, "__all__", []):
            if f"{modname}.{name}" not in documented:
                log.warning("%s.%s is public but on no API page (docs/api/)", modname, name)


def _public_bases(app: Any, name: str, obj: Any, options: Any, bases: list[Any]) -> None:
    """Show a class's public bases: a private base (``_ErrnoError``) is replaced by its
    own bases, so a page says "CheckpointError, OSError" rather than a name no user
    can import."""
    out: list[Any] = []
    todo = list(bases)
    while todo:
        base = todo.pop(0)
        if getattr(base, "__name__", "").startswith("_"):
            todo[:0] = list(base.__bases__)
        elif base not in out:
            out.append(base)
    bases[:] = out


def setup(app: Any) -> None:
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("missing-reference", _public_target)
    app.connect("env-check-consistency", _check_documented)
