"""Groups of models: which models of a router may stay loaded together. Pure.

llama-swap's ``groups`` (its ``config.example.yaml``, and mostlygeek/llama-swap#109), in
``models.toml`` as ``[groups.ID]`` tables::

    [groups.chat]
    members = ["qwen", "llama"]
    swap = true         # one member loaded at a time (false: all of them may be)
    exclusive = true    # loading a member unloads every model outside the group...
    persistent = false  # ...except the members of persistent groups

A model in no group is placed by memory alone, beside any other: where llama-swap runs one
model at a time unless a group says otherwise, the router packs models onto GPUs and unloads
one only when memory runs out (or a group's rule says so).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from xpulaunch.errors import UsageError, not_one_of, refuse_unknown_keys

GROUP_KEYS = ("members", "swap", "exclusive", "persistent")


@dataclass(frozen=True, slots=True)
class Group:
    id: str
    members: tuple[str, ...]
    swap: bool = True
    exclusive: bool = True
    persistent: bool = False


def must_unload(model_id: str, groups: Iterable[Group], loaded: Iterable[str]) -> list[str]:
    """Which of the ``loaded`` models to unload before ``model_id`` loads, in their order:
    the other members of its group when the group swaps; when it is exclusive, every model
    outside it too (in a group or in none) but the members of persistent groups."""
    group_of = {m: g for g in groups for m in g.members}
    own = group_of.get(model_id)

    def against(other: str) -> bool:
        if own is None or other == model_id:
            return False
        theirs = group_of.get(other)
        if theirs is own:
            return own.swap
        return own.exclusive and (theirs is None or not theirs.persistent)

    return [m for m in loaded if against(m)]


def parse_groups(tables: object, model_ids: Iterable[str], source: str) -> tuple[Group, ...]:
    """Check the ``[groups.ID]`` tables: known keys, members that are models, a model in one
    group at most."""
    if not isinstance(tables, Mapping):
        raise UsageError(f"{source}: groups: expected [groups.ID] tables")
    ids = tuple(model_ids)
    groups: list[Group] = []
    member_of: dict[str, str] = {}
    for name, table in tables.items():
        where = f"{source}: [groups.{name}]"
        if not isinstance(table, Mapping):
            raise UsageError(f"{where}: expected a table of {', '.join(GROUP_KEYS)}")
        refuse_unknown_keys(table, GROUP_KEYS, where)
        members = table.get("members")
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise UsageError(f'{where} members: expected a list of model ids, e.g. ["qwen"]')
        for member in members:
            if member not in ids:
                raise not_one_of(member, ids, "model", f"{where} members")
            if member in member_of:
                raise UsageError(
                    f"{where} members: {member!r} is in [groups.{member_of[member]}] already; "
                    "a model can be in one group"
                )
            member_of[member] = name
        flags = {k: _flag(table, k, default, where) for k, default in _DEFAULTS.items()}
        groups.append(Group(str(name), tuple(members), **flags))
    return tuple(groups)


_DEFAULTS = {"swap": True, "exclusive": True, "persistent": False}


def _flag(table: Mapping[str, object], key: str, default: bool, where: str) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise UsageError(f"{where} {key}: expected true or false, got {value!r}")
    return value
