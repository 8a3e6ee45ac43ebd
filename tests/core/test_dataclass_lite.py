"""xpulaunch._dataclass against the stdlib (issue 4: start-up time).

Every class body below is written once, in a function taking a :class:`Kit` (a decorator and
its ``field``), and built with both ``dataclasses`` and ours; the tests compare what the two
classes do. A hypothesis test does the same for random field layouts.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import inspect
import pickle
import subprocess
import sys
import textwrap
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xpulaunch import _dataclass, _dataclass_runtime
from xpulaunch._dataclass_runtime import FrozenInstanceError

SRC = Path(_dataclass.__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Kit:
    name: str
    dataclass: Callable[..., object]
    field: Callable[..., object]


STD = Kit("stdlib", dataclasses.dataclass, dataclasses.field)
OURS = Kit("ours", _dataclass.dataclass, _dataclass.field)
KITS = [pytest.param(STD, id="stdlib"), pytest.param(OURS, id="ours")]


def both(build: Callable[[Kit], type]) -> tuple[type, type]:
    return build(STD), build(OURS)


def outcome(action: Callable[[], object]) -> tuple[str, object]:
    """("ok", result) or ("error", exception class name): comparable across the two kits."""
    try:
        return "ok", action()
    except (TypeError, ValueError, AttributeError) as exc:
        return "error", type(exc).__name__


# -- class bodies, written once ------------------------------------------------------------------


def status_class(kit: Kit) -> type:
    @kit.dataclass(frozen=True, slots=True)
    class Status:
        name: str
        state: str
        pid: int | None
        restarts: int
        attempt: int
        exit_code: int | None
        ready: bool

    return Status


def device_class(kit: Kit) -> type:
    @kit.dataclass(frozen=True, slots=True)
    class Device:
        """A card."""

        vendor: str
        index: int
        name: str | None = None
        tiles: int = 1
        extra: dict[str, object] = kit.field(default_factory=dict, compare=False, hash=False)
        secret: str = kit.field(default="s", repr=False)
        cached: int = kit.field(default=0, init=False)
        LIMIT: ClassVar[int] = 8

    return Device


def event_classes(kit: Kit) -> tuple[type, type, type]:
    @kit.dataclass(frozen=True, slots=True)
    class Event:
        time_s: float

    @kit.dataclass(frozen=True, slots=True)
    class Exited(Event):
        name: str
        exit_code: int
        tail: tuple[str, ...] = ()

    @kit.dataclass(frozen=True, slots=True)
    class Ready(Event):
        name: str

    return Event, Exited, Ready


def policy_class(kit: Kit) -> type:
    @kit.dataclass(frozen=True, slots=True)
    class Policy:
        max_restarts: int = 3
        backoff_s: float = 1.0
        label: str = kit.field(default="", init=False)

        def __post_init__(self) -> None:
            if self.max_restarts < 0:
                raise ValueError(f"max restarts {self.max_restarts}: expected 0 or more")
            object.__setattr__(self, "label", f"{self.max_restarts}x{self.backoff_s}")

    return Policy


def lease_class(kit: Kit) -> type:
    @kit.dataclass(eq=False)
    class Lease:
        keys: tuple[str, ...]
        shared: bool = False
        released: bool = kit.field(default=False, init=False)
        notes: list[str] = kit.field(default_factory=list)

    return Lease


def result_class(kit: Kit) -> type:
    @kit.dataclass(slots=True)
    class Result:
        observations: list[int] = kit.field(default_factory=list)
        problems: list[str] = kit.field(default_factory=list)

    return Result


def hashed_class(kit: Kit) -> type:
    @kit.dataclass(frozen=True)
    class Hashed:
        a: int
        b: int

        def __hash__(self) -> int:
            return 42

    return Hashed


def node_class(kit: Kit) -> type:
    @kit.dataclass
    class Node:
        value: int
        children: list[object] = kit.field(default_factory=list)

    return Node


# Module-level classes, so that pickle finds them by name.
StdPickled, OurPickled = both(device_class)
StdPickled.__qualname__, OurPickled.__qualname__ = "StdPickled", "OurPickled"
StdResult, OurResult = both(result_class)
StdResult.__qualname__, OurResult.__qualname__ = "StdResult", "OurResult"


# -- construction ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs",
    [
        (("cuda", 0), {}),
        (("cuda", 1, "H100", 2), {}),
        ((), {"vendor": "xpu", "index": 3, "tiles": 2}),
        (("rocm",), {"index": 4, "extra": {"k": 1}, "secret": "x"}),
    ],
)
def test_construction_positional_keyword_and_defaults_match(args: tuple, kwargs: dict) -> None:
    std, ours = both(device_class)
    a, b = std(*args, **kwargs), ours(*args, **kwargs)
    assert repr(b) == repr(a)
    assert dataclasses.astuple(b) == dataclasses.astuple(a)
    assert b.cached == a.cached == 0


def test_default_factory_is_called_per_instance() -> None:
    for cls in both(device_class):
        first, second = cls("cuda", 0), cls("cuda", 1)
        assert first.extra == {} and first.extra is not second.extra


@pytest.mark.parametrize(
    "args, kwargs, needle",
    [
        ((), {}, "'vendor'"),  # missing
        (("cuda",), {}, "'index'"),
        (("cuda", 0, "n", 1, {}, "s", "extra"), {}, "positional"),  # too many
        (("cuda", 0), {"colour": "red"}, "'colour'"),  # unexpected
        (("cuda", 0), {"vendor": "xpu"}, "'vendor'"),  # duplicate
        (("cuda", 0), {"cached": 1}, "'cached'"),  # init=False is no parameter
    ],
)
def test_bad_arguments_are_type_errors_naming_the_argument(
    args: tuple, kwargs: dict, needle: str
) -> None:
    for cls in both(device_class):
        with pytest.raises(TypeError, match=needle):
            cls(*args, **kwargs)


def test_argument_errors_read_like_the_stdlibs() -> None:
    std, ours = both(status_class)
    for args, kwargs in [((), {}), (("a",) * 8, {}), (("a",) * 7, {"name": "b"}), ((), {"x": 1})]:
        with pytest.raises(TypeError) as expected:
            std(*args, **kwargs)
        with pytest.raises(TypeError) as got:
            ours(*args, **kwargs)
        assert str(got.value) == str(expected.value)


def test_a_field_named_self_is_a_keyword() -> None:
    for kit in (STD, OURS):

        @kit.dataclass
        class SelfField:
            self: int

        assert SelfField(self=1).self == SelfField(1).self == 1


# -- equality, hashing, repr ---------------------------------------------------------------------


def test_eq_compares_compare_fields_of_the_same_class_only() -> None:
    for cls in both(device_class):
        assert cls("cuda", 0, extra={"a": 1}) == cls("cuda", 0, extra={"b": 2})
        assert cls("cuda", 0) != cls("cuda", 1)
        assert cls("cuda", 0).__eq__(("cuda", 0)) is NotImplemented
    std, ours = both(device_class)
    assert std("cuda", 0) != ours("cuda", 0)  # different classes


class Verdict:
    """An ``__eq__`` result that is not a bool (numpy arrays do this)."""

    def __bool__(self) -> bool:
        return False


class Odd:
    def __eq__(self, other: object) -> object:
        return Verdict()

    __hash__ = object.__hash__


def pair_class(kit: Kit) -> type:
    @kit.dataclass(frozen=True)
    class Pair:
        x: object
        y: object = 0

    return Pair


def test_eq_compares_like_this_pythons_stdlib() -> None:
    # Before 3.13 fields compare as tuples (items by identity first: (nan,) == (nan,));
    # from 3.13 one by one, returning the first false result as it is.
    nan, odd = float("nan"), Odd()
    results = []
    for cls in both(pair_class):
        first = cls(nan, odd)
        results.append(
            (first == first, cls(nan) == cls(nan), type(cls(odd, 1) == cls(odd, 1)).__name__)
        )
        assert hash(cls(nan)) == hash((nan, 0))
    assert results[1] == results[0]


def test_subclass_instances_are_not_equal_to_base_instances() -> None:
    for event, exited, ready in (event_classes(STD), event_classes(OURS)):
        assert ready(1.0, "a") != exited(1.0, "a", 0)

        class Plain(event):  # same fields, another class
            pass

        assert event(1.0) != Plain(1.0) and Plain(1.0) != event(1.0)


def test_frozen_hash_uses_hash_fields_and_matches_the_stdlib() -> None:
    std, ours = both(device_class)
    a, b = std("cuda", 0, "x"), ours("cuda", 0, "x")
    assert hash(b) == hash(a)
    assert hash(ours("cuda", 0, "x", extra={"not": "hashed"})) == hash(b)
    assert {b, ours("cuda", 0, "x")} == {b}


def test_eq_without_frozen_is_unhashable_and_eq_false_keeps_identity() -> None:
    std, ours = both(node_class)
    assert std.__hash__ is None and ours.__hash__ is None
    with pytest.raises(TypeError, match="unhashable"):
        hash(ours(1))
    for cls in both(lease_class):
        first, second = cls(("a",)), cls(("a",))
        assert first != second and first == first
        assert hash(first) == object.__hash__(first)


def test_an_explicit_hash_in_the_body_is_kept() -> None:
    for cls in both(hashed_class):
        assert hash(cls(1, 2)) == 42


def test_repr_matches_the_stdlib_with_qualname_and_repr_false_fields_left_out() -> None:
    std, ours = both(device_class)
    assert repr(ours("cuda", 0, extra={"a": 1})) == repr(std("cuda", 0, extra={"a": 1}))
    assert repr(ours("cuda", 0)) == (
        "device_class.<locals>.Device(vendor='cuda', index=0, name=None, tiles=1, extra={}, "
        "cached=0)"
    )


def test_recursive_repr_is_cut_like_the_stdlibs() -> None:
    reprs = []
    for cls in both(node_class):
        node = cls(1)
        node.children.append(node)
        reprs.append(repr(node))
        assert repr(node) == reprs[-1]  # the guard is released after each repr
    assert reprs[1] == reprs[0] == "node_class.<locals>.Node(value=1, children=[...])"


def test_docstring_and_signature_match_the_stdlib() -> None:
    for build in (status_class, device_class, policy_class, lease_class):
        std, ours = both(build)
        assert ours.__doc__ == std.__doc__
        assert inspect.signature(ours) == inspect.signature(std)


def custom_init_class(kit: Kit) -> type:
    @kit.dataclass(frozen=True, slots=True)
    class Custom:
        a: int
        b: int = 0

        def __init__(self, total: int) -> None:
            object.__setattr__(self, "a", total - 1)
            object.__setattr__(self, "b", 1)

    return Custom


def named_subclass(status: type) -> type:
    class Named(status):
        def __init__(self, name: str) -> None:
            for field_ in dataclasses.fields(status):
                object.__setattr__(self, field_.name, name if field_.name == "name" else 0)

    return Named


def test_an_init_in_the_body_is_kept_and_a_subclass_has_its_own_signature() -> None:
    for kit in (STD, OURS):
        assert repr(custom_init_class(kit)(5)).endswith(".<locals>.Custom(a=4, b=1)")
        assert custom_init_class(kit).__doc__ == "Custom(total: 'int') -> 'None'"
        assert str(inspect.signature(custom_init_class(kit))) == "(total: 'int') -> 'None'"
        # replace() calls the class with every init field by name: the own __init__ refuses.
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            _dataclass.replace(custom_init_class(kit)(5), b=2)
        named = named_subclass(status_class(kit))
        assert str(inspect.signature(named)) == "(name: 'str') -> 'None'"
        assert named("w").name == "w"


def abstract_repr_class(kit: Kit) -> type:
    class Shape(abc.ABC):
        @abc.abstractmethod
        def __repr__(self) -> str: ...

    @kit.dataclass
    class Square(Shape):
        side: int

    return Square


def test_generated_methods_implement_abstract_ones() -> None:
    for cls in both(abstract_repr_class):
        assert repr(cls(2)).endswith(".Square(side=2)")


# -- frozen and slots ----------------------------------------------------------------------------


def test_frozen_assignment_and_deletion_raise_frozen_instance_error() -> None:
    std, ours = both(status_class)
    a, b = std("w", "ready", 1, 0, 1, None, True), ours("w", "ready", 1, 0, 1, None, True)
    for obj, error in ((a, dataclasses.FrozenInstanceError), (b, FrozenInstanceError)):
        with pytest.raises(error, match="cannot assign to field 'pid'"):
            obj.pid = 2
        with pytest.raises(error, match="cannot delete field 'pid'"):
            del obj.pid
    assert issubclass(FrozenInstanceError, AttributeError)
    assert _dataclass.FrozenInstanceError is FrozenInstanceError
    with pytest.raises(FrozenInstanceError):
        b.not_a_field = 1  # the stdlib raises a TypeError from super() here (see the module doc)


def test_a_plain_subclass_of_a_frozen_class_may_add_attributes_but_not_assign_fields() -> None:
    for kit, error in ((STD, dataclasses.FrozenInstanceError), (OURS, FrozenInstanceError)):

        @kit.dataclass(frozen=True)
        class Base:
            a: int

        class Plain(Base):
            pass

        plain = Plain(1)
        plain.extra = 2
        assert plain.extra == 2
        with pytest.raises(error):
            plain.a = 3


def test_slots_match_the_stdlib_without_dict_or_weakref() -> None:
    for build in (status_class, device_class, result_class):
        std, ours = both(build)
        assert ours.__slots__ == std.__slots__
        assert "__dict__" not in dir(ours) and "__weakref__" not in dir(ours)
    _, exited, _ = event_classes(OURS)
    assert exited.__slots__ == ("name", "exit_code", "tail")  # time_s is the base's slot
    instance = exited(1.0, "a", 0)
    assert not hasattr(instance, "__dict__")
    with pytest.raises(TypeError):
        weakref.ref(instance)


def test_a_class_with_its_own_slots_cannot_be_slotted_again() -> None:
    for kit in (STD, OURS):
        with pytest.raises(TypeError, match="already specifies __slots__"):

            @kit.dataclass(slots=True)
            class Slotted:
                __slots__ = ("a",)
                a: int


def test_non_frozen_slotted_and_plain_classes_are_mutable() -> None:
    result = OurResult()
    result.problems.append("p")
    result.observations = [1]
    assert result == OurResult([1], ["p"])
    std, ours = both(lease_class)
    assert ours.released is std.released is False  # plain defaults stay on the class
    assert "notes" not in vars(ours) and "notes" not in vars(std)
    lease = ours(("a",))
    lease.released = True
    assert vars(lease) == {"keys": ("a",), "shared": False, "notes": [], "released": True}


def watched_class(kit: Kit, seen: list[str]) -> type:
    @kit.dataclass(slots=True)
    class Watched:
        a: int
        b: int = 2

        def __setattr__(self, name: str, value: object) -> None:
            seen.append(name)
            object.__setattr__(self, name, value)

    return Watched


def test_a_custom_setattr_of_a_non_frozen_class_runs_during_init() -> None:
    for kit in (STD, OURS):
        seen: list[str] = []
        watched_class(kit, seen)(1)
        assert seen == ["a", "b"]


# -- inheritance, __post_init__, __match_args__ --------------------------------------------------


def test_inherited_fields_come_first_and_an_override_keeps_its_place() -> None:
    orders = []
    for kit in (STD, OURS):
        event, exited, _ = event_classes(kit)

        @kit.dataclass(frozen=True, slots=True)
        class Override(exited):
            time_s: float = 0.0
            name: str = "x"
            exit_code: int = 1
            extra: int = 2

        orders.append([f.name for f in dataclasses.fields(Override)])
        assert repr(Override()).endswith("(time_s=0.0, name='x', exit_code=1, tail=(), extra=2)")
        assert isinstance(Override(), event)
    assert orders[1] == orders[0] == ["time_s", "name", "exit_code", "tail", "extra"]


def test_frozen_and_non_frozen_classes_do_not_mix() -> None:
    for kit in (STD, OURS):
        event, _, _ = event_classes(kit)
        with pytest.raises(TypeError, match="non-frozen dataclass from a frozen one"):

            @kit.dataclass
            class Thawed(event):
                x: int

        lease = lease_class(kit)
        with pytest.raises(TypeError, match="frozen dataclass from a non-frozen one"):

            @kit.dataclass(frozen=True)
            class Frozen(lease):
                x: int


def test_post_init_runs_after_the_fields_are_set() -> None:
    std, ours = both(policy_class)
    assert ours(2, 0.5).label == std(2, 0.5).label == "2x0.5"
    assert ours().label == std().label == "3x1.0"
    for cls in (std, ours):
        with pytest.raises(ValueError, match="max restarts -1"):
            cls(-1)


def test_match_args_and_a_match_statement() -> None:
    std, ours = both(device_class)
    expected = ("vendor", "index", "name", "tiles", "extra", "secret")  # init fields
    assert ours.__match_args__ == std.__match_args__ == expected
    match ours("xpu", 2, tiles=4):
        case std(_, _):
            pytest.fail("matched the other kit's class")
        case ours("xpu", index, tiles=tiles):
            assert (index, tiles) == (2, 4)
        case _:
            pytest.fail("no match")


def test_class_variables_and_field_class_attributes_match_the_stdlib() -> None:
    std, ours = both(device_class)
    assert ours.LIMIT == std.LIMIT == 8
    assert "LIMIT" not in [f.name for f in dataclasses.fields(ours)]
    std_lease, our_lease = both(lease_class)
    for name in ("shared", "released", "notes", "keys"):
        assert hasattr(our_lease, name) == hasattr(std_lease, name)


# -- pickle, copy and the stdlib's functions -----------------------------------------------------


@pytest.mark.parametrize("cls", [StdPickled, OurPickled, StdResult, OurResult])
def test_pickle_and_copy_round_trip(cls: type) -> None:
    original = cls("xpu", 1, extra={"k": [1]}) if "Pickled" in cls.__name__ else cls([1], ["p"])
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):  # slots need 2+ (copyreg)
        assert pickle.loads(pickle.dumps(original, protocol)) == original
    assert copy.copy(original) == original
    deep = copy.deepcopy(original)
    assert deep == original and repr(deep) == repr(original)


def test_pickle_state_is_the_stdlibs() -> None:
    a, b = StdPickled("xpu", 1), OurPickled("xpu", 1)
    assert b.__getstate__() == a.__getstate__()


def test_stdlib_functions_work_on_our_classes_and_instances() -> None:
    std, ours = both(device_class)
    a, b = std("cuda", 0, extra={"k": 1}), ours("cuda", 0, extra={"k": 1})
    assert dataclasses.is_dataclass(ours) and dataclasses.is_dataclass(b)
    keys = ("name", "type", "default", "init", "repr", "hash", "compare", "default_factory")
    assert [[getattr(f, k) for k in keys] for f in dataclasses.fields(b)] == [
        [getattr(f, k) for k in keys] for f in dataclasses.fields(a)
    ]
    assert dataclasses.asdict(b) == dataclasses.asdict(a)
    changed = dataclasses.replace(b, index=5)
    assert type(changed) is ours and changed == ours("cuda", 5)
    assert ours.__dataclass_params__.frozen and ours.__dataclass_params__.eq


def test_the_stdlib_view_is_built_once_and_cached() -> None:
    ours = status_class(OURS)
    assert not isinstance(ours.__dict__["__dataclass_fields__"], dict)  # not built yet
    fields = ours.__dataclass_fields__
    assert ours.__dict__["__dataclass_fields__"] is fields is ours.__dataclass_fields__


def test_a_stdlib_dataclass_may_subclass_ours() -> None:
    event, _, _ = event_classes(OURS)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Later(event):
        name: str = "x"

    assert repr(Later(1.0)).endswith(".<locals>.Later(time_s=1.0, name='x')")
    assert Later(1.0) == Later(1.0)
    # Its fields are the stdlib's, the subclass's own included, for either replace().
    for replace in (dataclasses.replace, _dataclass.replace):
        assert replace(Later(1.0, "y"), time_s=2.0) == Later(2.0, "y")


def test_our_replace_follows_the_stdlibs_rules() -> None:
    std, ours = both(device_class)
    errors: list[type] = []  # ValueError before Python 3.13, TypeError from 3.13
    for cls, replace in ((std, dataclasses.replace), (ours, _dataclass.replace)):
        original = cls("cuda", 0, "a")
        changed = replace(original, tiles=2, name="b")
        assert changed == cls("cuda", 0, "b", 2) and original.tiles == 1
        with pytest.raises((ValueError, TypeError), match="init=False") as error:
            replace(original, cached=1)
        errors.append(error.type)
        with pytest.raises(TypeError):
            replace(original, colour="red")
    assert errors[1] is errors[0]
    assert _dataclass.replace(std("cuda", 0), index=1) == std("cuda", 1)  # delegates
    with pytest.raises(TypeError):
        _dataclass.replace(ours, index=1)  # a class, not an instance


def test_copy_replace_support_follows_this_pythons_stdlib() -> None:
    std, ours = both(device_class)
    assert hasattr(ours, "__replace__") == hasattr(std, "__replace__")  # Python >= 3.13
    if hasattr(std, "__replace__"):
        replaced = copy.replace(ours("cuda", 0), index=2)
        assert replaced == ours("cuda", 2)


# -- decoration-time errors ----------------------------------------------------------------------


@pytest.mark.parametrize("kit", KITS)
def test_a_non_default_field_after_a_default_one_is_a_type_error(kit: Kit) -> None:
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):

        @kit.dataclass
        class Bad:
            a: int = 1
            b: int


@pytest.mark.parametrize("kit", KITS)
def test_a_non_init_field_without_default_may_follow_defaults(kit: Kit) -> None:
    @kit.dataclass
    class Fine:
        a: int = 1
        b: int = kit.field(init=False)

    assert not hasattr(Fine(), "b")


@pytest.mark.parametrize("kit", KITS)
def test_mutable_defaults_and_unannotated_fields_are_rejected(kit: Kit) -> None:
    with pytest.raises(ValueError, match="use default_factory"):

        @kit.dataclass
        class Mutable:
            a: list[int] = []  # noqa: RUF012

    with pytest.raises(TypeError, match="'b' is a field but has no type annotation"):

        @kit.dataclass
        class Unannotated:
            b = kit.field(default=1)

    with pytest.raises(ValueError, match="cannot specify both"):
        kit.field(default=1, default_factory=list)


@pytest.mark.parametrize(
    "options", [{"order": True}, {"kw_only": True}, {"init": False}, {"weakref_slot": True}]
)
def test_unsupported_decorator_arguments_are_type_errors(options: dict) -> None:
    with pytest.raises(TypeError, match=f"'{next(iter(options))}' is not supported"):

        @_dataclass.dataclass(**options)
        class Anything:
            a: int


def test_unsupported_field_arguments_and_pseudo_fields_are_type_errors() -> None:
    with pytest.raises(TypeError, match="'metadata' is not supported"):
        _dataclass.field(metadata={"a": 1})
    with pytest.raises(TypeError, match="InitVar and KW_ONLY"):

        @_dataclass.dataclass
        class WithInitVar:
            a: dataclasses.InitVar[int]

    with pytest.raises(TypeError, match=r"is a dataclasses\.dataclass"):

        @_dataclass.dataclass
        class OnStdlib(node_class(STD)):
            extra: int = 0


# -- random layouts ------------------------------------------------------------------------------

FIELD_SPECS = st.fixed_dictionaries(
    {
        "default": st.sampled_from(["none", "value", "factory"]),
        "init": st.booleans(),
        "repr": st.booleans(),
        "compare": st.booleans(),
        "hash": st.sampled_from([None, True, False]),
    }
)


def random_class(
    kit: Kit, specs: list[dict], options: dict, names: list[str] | None = None, bases: tuple = ()
) -> type:
    """One class body from ``specs`` (the same for both kits), decorated by ``kit``."""
    body: dict[str, object] = {"__annotations__": {}, "__module__": __name__}
    for i, spec in enumerate(specs):
        name = names[i] if names else f"f{i}"
        body["__annotations__"][name] = "int"
        flags = {k: spec[k] for k in ("init", "repr", "compare", "hash")}
        if spec["default"] == "value":
            flags["default"] = 100 + i
        elif spec["default"] == "factory":
            flags["default_factory"] = list
        body[name] = kit.field(**flags)
    return kit.dataclass(type("Random", bases, body), **options)


def compare_instances(std: type, ours: type, args: tuple, kwargs: dict, options: dict) -> None:
    a, b = outcome(lambda: std(*args, **kwargs)), outcome(lambda: ours(*args, **kwargs))
    assert a[0] == b[0] and (a[0] == "ok" or a == b)
    if a[0] != "ok":
        return
    a1, b1, a2, b2 = a[1], b[1], std(*args, **kwargs), ours(*args, **kwargs)
    assert outcome(lambda: repr(b1)) == outcome(lambda: repr(a1))
    assert outcome(lambda: b1 == b2) == outcome(lambda: a1 == a2)
    assert (ours.__hash__ is None) == (std.__hash__ is None)
    if options["frozen"] and options["eq"]:
        assert outcome(lambda: hash(b1)) == outcome(lambda: hash(a1))
    std_values = [outcome(lambda f=f: getattr(a1, f.name)) for f in dataclasses.fields(a1)]
    our_values = [outcome(lambda f=f: getattr(b1, f.name)) for f in dataclasses.fields(b1)]
    assert our_values == std_values


def valid_call(std: type, data: st.DataObject) -> tuple[tuple, dict]:
    """Some init fields by position, the remaining required ones and some others by name."""
    init = [f for f in dataclasses.fields(std) if f.init]
    n_args = data.draw(st.integers(0, len(init)))
    required = {f.name for f in init if f.default is f.default_factory is dataclasses.MISSING}
    names = [f.name for f in init[n_args:] if f.name in required or data.draw(st.booleans())]
    return tuple(range(n_args)), {name: -1 for name in names}


OPTIONS = st.fixed_dictionaries(
    {"frozen": st.booleans(), "slots": st.booleans(), "eq": st.booleans()}
)


@given(
    specs=st.lists(FIELD_SPECS, max_size=5),
    options=OPTIONS,
    n_args=st.integers(0, 6),
    keywords=st.lists(st.sampled_from(["f0", "f1", "f2", "f3", "f4", "bogus"]), unique=True),
    data=st.data(),
)
def test_random_layouts_behave_like_the_stdlib(
    specs: list[dict], options: dict, n_args: int, keywords: list[str], data: st.DataObject
) -> None:
    built = [outcome(lambda kit=kit: random_class(kit, specs, options)) for kit in (STD, OURS)]
    assert built[0][0] == built[1][0] and (built[0][0] == "ok" or built[0] == built[1])
    if built[0][0] != "ok":
        return
    std, ours = built[0][1], built[1][1]
    assert ours.__match_args__ == std.__match_args__
    assert ours.__doc__ == std.__doc__
    compare_instances(std, ours, *valid_call(std, data), options)
    compare_instances(std, ours, tuple(range(n_args)), {k: -1 for k in keywords}, options)


@given(
    base_specs=st.lists(FIELD_SPECS, min_size=1, max_size=3),
    sub_specs=st.lists(FIELD_SPECS, max_size=3),
    overrides=st.integers(0, 3),
    options=st.lists(OPTIONS, min_size=2, max_size=2),
    data=st.data(),
)
def test_random_inheritance_behaves_like_the_stdlib(
    base_specs: list[dict],
    sub_specs: list[dict],
    overrides: int,
    options: list[dict],
    data: st.DataObject,
) -> None:
    # The subclass redefines the first ``overrides`` base fields and adds g0, g1, ...
    names = [f"f{i}" if i < overrides else f"g{i}" for i in range(len(sub_specs))]
    base_options = {**options[0], "frozen": options[1]["frozen"]}  # mixing them: tested above

    def build(kit: Kit) -> type:
        base = random_class(kit, base_specs, base_options)
        return random_class(kit, sub_specs, options[1], names, (base,))

    built = [outcome(lambda kit=kit: build(kit)) for kit in (STD, OURS)]
    assert built[0][0] == built[1][0] and (built[0][0] == "ok" or built[0] == built[1])
    if built[0][0] != "ok":
        return
    std, ours = built[0][1], built[1][1]
    assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(std)]
    assert ours.__match_args__ == std.__match_args__
    compare_instances(std, ours, *valid_call(std, data), options[1])


# -- start-up cost and the type checker's view ---------------------------------------------------

FOOTPRINT = """
import sys
before = set(sys.modules)  # some images' site hooks load typing at start-up
# Load our modules without xpulaunch/__init__.py, which has imports of its own.
package = type(sys)("xpulaunch")
package.__path__ = [{src!r}]
sys.modules["xpulaunch"] = package
import {first}  # any of the modules may be the first one imported: no import cycle
from xpulaunch._dataclass import dataclass, field, replace

@dataclass(frozen=True, slots=True)
class Base:
    a: int

@dataclass(frozen=True, slots=True)
class Point(Base):
    b: str = "x"
    c: list = field(default_factory=list, compare=False)

point = replace(Point(1), b="y")
assert repr(point) == "Point(a=1, b='y', c=[])" and point == Point(1, "y"), point
names = ("dataclasses", "inspect", "typing")
print(" ".join(name for name in names if name in sys.modules and name not in before))
"""


@pytest.mark.parametrize(
    "first", ["_dataclass", "_dataclass_runtime", "_dataclass_init", "_dataclass_compat"]
)
def test_import_and_decoration_load_neither_dataclasses_inspect_nor_typing(first: str) -> None:
    code = FOOTPRINT.format(src=str(SRC / "xpulaunch"), first=f"xpulaunch.{first}")
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


MYPY_SCRATCH = """
from __future__ import annotations
from xpulaunch._dataclass import dataclass, field, replace

@dataclass(frozen=True, slots=True)
class Point:
    x: int
    tags: list[str] = field(default_factory=list)

point = Point(1)
Point("one")
Point(1, [], 3)
Point(x=1, y=2)
point.x = 2
replace(point, x="two")
"""


def test_mypy_sees_the_stdlib_dataclass_through_the_facade(tmp_path: Path) -> None:
    pytest.importorskip("mypy")  # a dev dependency: installed wherever ./scripts/test runs
    scratch = tmp_path / "scratch.py"
    scratch.write_text(textwrap.dedent(MYPY_SCRATCH))
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", "/dev/null", str(scratch)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,  # no project config: only what the facade itself tells mypy
        env={"MYPYPATH": str(SRC), "PATH": "/usr/bin:/bin"},
    )
    errors = {
        int(line.split(":")[1]): line for line in done.stdout.splitlines() if ": error:" in line
    }
    assert sorted(errors) == [11, 12, 13, 14, 15], done.stdout
    assert "incompatible type" in errors[11] and "Too many arguments" in errors[12]
    assert '"y"' in errors[13] and "read-only" in errors[14] and "replace" in errors[15]


def test_the_runtime_module_is_what_the_facade_exports_at_run_time() -> None:
    assert _dataclass.dataclass is _dataclass_runtime.dataclass
    assert _dataclass.field is _dataclass_runtime.field
    assert _dataclass.replace is _dataclass_runtime.replace
