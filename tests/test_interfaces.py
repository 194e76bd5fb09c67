"""Every kind model/ defines implements its family's interface (model/interfaces.py), so that a new kind that misses
a member fails here, before any command runs; and docs/architecture.md's table of the members is the code's."""
import re

import pytest
import torch

from model.block import ATTENTION_KINDS, FFN_KINDS
from model.interfaces import FeedForwardKind, LayerCache, Mixer, PositionKind, missing_members
from tests.data_helpers import ROOT


def defined(family: type) -> list[type]:
    """The classes model/ derives from family, at any depth (RollingCache from FullCache): the kinds, registered in
    model/block.py or built by another kind (a cache by its mixer, a position table by make_positions)."""
    kinds = [kind for kind in family.__subclasses__() if kind.__module__.startswith("model.")]
    return [deeper for kind in kinds for deeper in [kind, *defined(kind)]]


FAMILIES = {family: defined(family) for family in (Mixer, FeedForwardKind, PositionKind, LayerCache)}


def test_the_registries_kinds_are_their_families():
    assert set(ATTENTION_KINDS) <= set(FAMILIES[Mixer]) and set(FFN_KINDS) <= set(FAMILIES[FeedForwardKind])
    assert [len(kinds) for kinds in FAMILIES.values()] == [3, 2, 2, 4]  # the discovery found every kind


@pytest.mark.parametrize("family, kind", [(family, kind) for family, kinds in FAMILIES.items() for kind in kinds],
                         ids=lambda value: value.__name__)
def test_every_kind_implements_every_required_member(family, kind):
    assert missing_members(kind, family) == []


def without(kind: type, name: str) -> type:
    """kind's members, one of them left out, as a class of the same family: the kind a contributor forgot it in."""
    family = next(family for family, kinds in FAMILIES.items() if kind in kinds)
    members = {key: value for cls in reversed(kind.__mro__[:kind.__mro__.index(family)])
               for key, value in vars(cls).items() if key != name}
    return type(f"{kind.__name__}Without_{name}", (family,), members)


@pytest.mark.parametrize("kind, name", [(ATTENTION_KINDS[-1], "weights"), (ATTENTION_KINDS[0], "PER_POSITION"),
                                        (FFN_KINDS[-1], "take_aux_losses"), (FFN_KINDS[0], "flops_per_token"),
                                        (FAMILIES[LayerCache][-1], "fill_from")])
def test_a_kind_that_leaves_out_a_required_member_is_named_and_cannot_be_built(kind, name):
    broken = without(kind, name)
    family = broken.__mro__[1]
    required = name in getattr(family, "__abstractmethods__", ()) or name in family.__dict__.get("__annotations__", {})
    if not required:  # an optional member: the family's default answers for it
        assert missing_members(broken, family) == [] and getattr(broken, name) is getattr(family, name)
        return
    assert missing_members(broken, family) == [name]
    if name in family.__abstractmethods__:
        with pytest.raises(TypeError, match=name):
            broken.__new__(broken)


def documented_members() -> dict[str, set[str]]:
    """docs/architecture.md's interface table: each family's name, then its members in backticks."""
    text = (ROOT / "docs/architecture.md").read_text()
    section = text.split("## What a kind answers")[1].split("\n## ")[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| `")]
    return {family.strip(" `"): set(re.findall(r"`(\w+)`", members)) for family, members, *_ in rows}


def declared_members(family: type) -> set[str]:
    """What the family and its bases in model/interfaces.py declare (not nn.Module's own members)."""
    declared = set()
    for cls in family.__mro__[:family.__mro__.index(torch.nn.Module) if torch.nn.Module in family.__mro__ else 1]:
        declared |= {name for name in vars(cls) if not name.startswith("_")}
        declared |= set(cls.__dict__.get("__annotations__", {}))
    return declared


def test_the_documented_interface_is_the_declared_one():
    assert documented_members() == {family.__name__: declared_members(family) for family in FAMILIES}
