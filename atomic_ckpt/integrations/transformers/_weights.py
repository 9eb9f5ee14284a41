"""Which weight files of an earlier ``save_pretrained`` a new one into the same directory
makes stale: stock's own rule, and the other layout's entry point beside it."""

from __future__ import annotations

import re
from collections.abc import Iterable

_SHARD = re.compile(r"(.*?)-\d{5}-of-\d{5}")
"""A shard's name without its extension (``model-00001-of-00003``): stock's pattern."""
_FORMATS = ("safetensors", "bin")
_BASES = frozenset({"model", "pytorch_model", "adapter_model"})
"""The weight names ``save_pretrained`` writes (``model.safetensors``, 4.x's
``pytorch_model.bin``, PEFT's ``adapter_model.safetensors``), before a variant or a shard
number: files of other names (``training_args.bin``) are never weights."""


def stale_weights(written: Iterable[str], present: Iterable[str]) -> list[str]:
    """The names in ``present`` (the files of the output directory) that the save which
    wrote ``written`` (names in the same directory) makes stale, sorted.

    Stock ``save_pretrained`` deletes, before it writes, every shard
    (``<stem>*-NNNNN-of-NNNNN.<ext>``) of its weight name it is not about to rewrite. It
    keeps an unsharded ``model.safetensors`` when the new save is sharded, and that file is
    what ``from_pretrained`` loads first: the old model. It keeps the old
    ``model.safetensors.index.json`` when the new save is unsharded (harmless, but
    misleading). Both go too, so that ``from_pretrained`` loads the new model whichever way
    the layout changed and the directory holds no weights of an older save."""
    new = set(written)
    stems: set[tuple[str, str]] = set()
    for name in new:
        stem, dot, fmt = name.rpartition(".")
        if not dot or "/" in name or fmt not in _FORMATS:
            continue
        shard = _SHARD.fullmatch(stem)
        stem = shard.group(1) if shard is not None else stem
        if stem.split(".", 1)[0] in _BASES:
            stems.add((stem, fmt))
    stale = []
    for name in present:
        if name in new:
            continue
        bare = name.replace(".bin", "").replace(".safetensors", "")
        for stem, fmt in stems:
            base, _, variant = stem.partition(".")
            index = f"{base}.{fmt}.index{f'.{variant}' if variant else ''}.json"
            if (
                # Stock's rule (modeling_utils.save_pretrained, "Clean the folder").
                (name.startswith(stem) and _SHARD.fullmatch(bare) is not None)
                or name in (f"{stem}.{fmt}", index)
            ):
                stale.append(name)
                break
    return sorted(stale)
