"""The API reference's CheckpointDir page lists every public member once, in a named group."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from atomic_ckpt import CheckpointDir

PAGE = Path(__file__).resolve().parents[2] / "docs" / "api" / "atomic_ckpt.rst"

_MEMBER = re.compile(r"^\.\. auto(?:method|property|attribute):: CheckpointDir\.(\w+)\s*$", re.M)


def _public_members() -> set[str]:
    return {name for name in dir(CheckpointDir) if not name.startswith("_")}


def _class_block(text: str) -> str:
    """The page's ``autoclass:: CheckpointDir`` directive with its options."""
    match = re.search(r"^\.\. autoclass:: CheckpointDir\n((?:   .*\n)*)", text, re.M)
    assert match is not None, "the page has no autoclass:: CheckpointDir"
    return match.group(0)


def test_every_public_member_appears_exactly_once() -> None:
    """Each public member of CheckpointDir has one automethod/autoproperty entry, no more."""
    text = PAGE.read_text()
    counts = Counter(_MEMBER.findall(text))
    missing = _public_members() - set(counts)
    twice = sorted(name for name, n in counts.items() if n > 1)
    unknown = sorted(set(counts) - _public_members())
    assert not missing, f"CheckpointDir members missing from {PAGE.name}: {sorted(missing)}"
    assert not twice, f"documented more than once: {twice}"
    assert not unknown, f"listed but not public members of CheckpointDir: {unknown}"


def test_the_class_directive_does_not_list_members_itself() -> None:
    """autoclass:: CheckpointDir takes :no-members:, so autodoc does not list them a second time."""
    block = _class_block(PAGE.read_text())
    assert ":no-members:" in block
    assert ":members:" not in block.replace(":no-members:", "")


def test_members_sit_in_groups_with_a_lead() -> None:
    """Every member entry follows a group heading whose first paragraph is one line."""
    text = PAGE.read_text()
    start = text.index(_class_block(text)) + len(_class_block(text))
    body = text[start:]
    sections = re.split(r"^(.+)\n~+\n", body, flags=re.M)
    assert _MEMBER.search(sections[0]) is None, "members listed before the first group heading"
    groups = dict(zip(sections[1::2], sections[2::2], strict=True))
    listed = {title: _MEMBER.findall(part) for title, part in groups.items()}
    assert sum(len(names) for names in listed.values()) == len(_public_members())
    for title, part in groups.items():
        if not listed[title]:
            continue
        lead = part.strip().split("\n\n", 1)[0]
        assert lead, f"{title!r} has no lead"
        assert "\n" not in lead, f"{title!r}'s lead is more than one line"
        assert not lead.startswith(".."), f"{title!r} starts with a directive, not a lead"
