"""The run-time half of :mod:`xpulaunch._dataclass`: dataclasses without ``dataclasses``.

Why (issue 4, start-up time): ``dataclasses.dataclass`` exec()s generated source for each
method of each class and calls ``inspect.signature`` for a class without a docstring (~0.7 ms a
class), and ``import dataclasses`` loads ``inspect`` (ast, dis, tokenize...: 4-8 ms). Here the
methods are closures over per-class tuples computed once, and only built-in modules are imported.

This module has the decorator, ``field``, ``replace`` and most generated methods; ``__init__``
and the pickle state come from :mod:`xpulaunch._dataclass_init`, and the stdlib's view of a
class (for ``dataclasses.fields`` and the like) from :mod:`xpulaunch._dataclass_compat`.
The subset behaves as the running Python's Lib/dataclasses.py (3.10 to 3.13) but for the
``__init__`` differences named there and one more: a frozen slotted instance raises
FrozenInstanceError for a non-field name too, where the stdlib's raises a stray TypeError.
"""

from __future__ import annotations

import abc  # loaded by every interpreter at start-up (io needs it)
import sys
from _thread import get_ident

from xpulaunch._dataclass_compat import is_classvar, lazy_attributes, stdlib_replace
from xpulaunch._dataclass_init import MEMBER_DESCRIPTOR, getter, make_init, make_state

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from xpulaunch._dataclass_init import Getter

    Factory = Callable[[], object]

# Python 3.13 changed two things we follow: replace() of an init=False field is a TypeError
# (gh-110273), and __eq__ compares field by field, no longer as tuples (gh-104904, gh-128294).
_PY313 = sys.version_info >= (3, 13)
_REPLACE_ERROR = TypeError if _PY313 else ValueError
SPEC_ATTR = "__xpulaunch_dataclass__"  # our per-class metadata; marks a class decorated here
_FIELD_OPTIONS = ("default", "default_factory", "init", "repr", "hash", "compare")


class FrozenInstanceError(AttributeError):
    """Assignment to, or deletion of, a field of a frozen instance. Not the stdlib's class (that
    would import dataclasses): catch AttributeError, their common base, to catch both."""


class _Missing:
    __slots__ = ()


MISSING = _Missing()


class Field:
    """What ``field()`` returns; the decorator fills in ``name`` and ``type``."""

    __slots__ = ("compare", "default", "default_factory", "hash", "init", "name", "repr", "type")

    def __init__(self, **options: Any) -> None:
        self.name = ""
        self.type: object = None
        self.default: object = options.get("default", MISSING)
        self.default_factory: Factory | _Missing = options.get("default_factory", MISSING)
        self.init: bool = options.get("init", True)
        self.repr: bool = options.get("repr", True)
        self.hash: bool | None = options.get("hash")
        self.compare: bool = options.get("compare", True)

    @property
    def has_default(self) -> bool:
        return self.default is not MISSING or self.has_factory

    @property
    def has_factory(self) -> bool:
        return self.default_factory is not MISSING


def _check_options(function: str, options: Iterable[str], supported: tuple[str, ...]) -> None:
    unsupported = [repr(name) for name in options if name not in supported]
    if unsupported:
        raise TypeError(
            f"{function}() argument {', '.join(unsupported)} is not supported by "
            f"xpulaunch._dataclass (supported: {', '.join(supported)}); use dataclasses.{function}"
        )


def field(**options: Any) -> Any:
    """``dataclasses.field`` for the arguments of :class:`Field`; any other is a TypeError."""
    _check_options("field", options, _FIELD_OPTIONS)
    if "default" in options and "default_factory" in options:
        raise ValueError("cannot specify both default and default_factory")
    return Field(**options)


def dataclass(cls: type | None = None, /, **options: bool) -> Any:
    """``dataclasses.dataclass`` for ``frozen``, ``slots`` and ``eq``; any other is a TypeError."""
    _check_options("dataclass", options, ("frozen", "slots", "eq"))

    def wrap(cls: type) -> type:
        return _process(cls, **options)

    return wrap if cls is None else wrap(cls)


_FIELDS_ATTR = "__dataclass_fields__"


def replace(obj: Any, /, **changes: object) -> Any:
    """A copy of ``obj`` with ``changes``, by the rules of ``dataclasses.replace``."""
    spec: Spec | None = getattr(type(obj), SPEC_ATTR, None)
    if spec is None or (spec.cls is not type(obj) and _FIELDS_ATTR in type(obj).__dict__):
        # Not ours, or a subclass that the stdlib decorated: its fields are the stdlib's.
        return stdlib_replace(obj, changes)
    if obj.__class__ is spec.cls and spec.our_init and changes.keys() <= spec.index.keys():
        values = list(spec.values(obj))  # then the positional fast path of __init__
        for name, value in changes.items():
            values[spec.index[name]] = value
        return spec.cls(*values)
    for f in spec.fields:
        if f.init and f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
        elif not f.init and f.name in changes:
            raise _REPLACE_ERROR(
                f"field {f.name} is declared with init=False, it cannot be specified with replace()"
            )
    return obj.__class__(**changes)


class Spec:
    """What the decorator learnt about one class; kept on it as ``__xpulaunch_dataclass__``."""

    def __init__(self, cls: type, fields: dict[str, Field], *, frozen: bool, slots: bool, eq: bool):
        self.cls, self.fields, self.names = cls, tuple(fields.values()), tuple(fields)
        self.frozen, self.slots, self.eq = frozen, slots, eq
        self.init_names = tuple(f.name for f in self.fields if f.init)
        # For replace()'s fast path: where each init field goes in __init__, and their values.
        self.index = {name: i for i, name in enumerate(self.init_names)}
        self.values = getter(self.init_names)
        self.our_init = "__init__" not in cls.__dict__  # else the class's own


# -- decoration -----------------------------------------------------------------------------------


def _process(cls: type, *, frozen: bool = False, slots: bool = False, eq: bool = True) -> type:
    spec = Spec(cls, _collect_fields(cls, frozen), frozen=frozen, slots=slots, eq=eq)
    _check_default_order(spec)
    namespace = _namespace(cls, spec)
    if slots:
        final = _slotted(cls, spec, namespace)
    else:
        final = cls
        _set_class_defaults(cls, spec)
        for name, value in namespace.items():
            setattr(cls, name, value)
    spec.cls = final
    if spec.our_init:
        type.__setattr__(final, "__init__", make_init(spec, final))
    abc.update_abstractmethods(final)  # our methods may implement abstract ones (as the stdlib)
    return final


def _collect_fields(cls: type, frozen: bool) -> dict[str, Field]:
    """Inherited fields (in base order, overridden in place), then the class's own."""
    fields = _inherited_fields(cls, frozen)
    # Not inspect.get_annotations: inspect is what we avoid loading.
    annotations: dict[str, object] = cls.__dict__.get("__annotations__", {})  # noqa: RUF063
    for name, annotation in annotations.items():
        if not is_classvar(annotation, cls, name):
            fields[name] = _own_field(cls, name, annotation)
    for name, value in cls.__dict__.items():
        if isinstance(value, Field) and name not in annotations:
            raise TypeError(f"{name!r} is a field but has no type annotation")
    return fields


def _inherited_fields(cls: type, frozen: bool) -> dict[str, Field]:
    fields: dict[str, Field] = {}
    frozen_bases: set[bool] = set()
    for base in cls.__mro__[-1:0:-1]:
        base_spec: Spec | None = base.__dict__.get(SPEC_ATTR)
        if base_spec is not None:
            frozen_bases.add(base_spec.frozen)
            fields.update(zip(base_spec.names, base_spec.fields, strict=True))
        elif "__dataclass_fields__" in base.__dict__:
            raise TypeError(
                f"{cls.__name__}: base {base.__qualname__} is a dataclasses.dataclass; "
                "decorate it with xpulaunch._dataclass.dataclass too"
            )
    if frozen_bases and frozen not in frozen_bases:
        nots = ("", "non-") if frozen else ("non-", "")
        raise TypeError(f"cannot inherit {nots[0]}frozen dataclass from a {nots[1]}frozen one")
    return fields


def _own_field(cls: type, name: str, annotation: object) -> Field:
    default = getattr(cls, name, MISSING)
    if isinstance(default, Field):
        f = default
    elif default is MISSING or type(default) is MEMBER_DESCRIPTOR:
        f = Field()  # an inherited __slots__ entry is no default (the stdlib's _get_field)
    else:
        f = Field(default=default)
    f.name, f.type = name, annotation
    if f.default is not MISSING and type(f.default).__hash__ is None:
        # The stdlib's rule: an unhashable default is taken for a shared mutable one.
        raise ValueError(
            f"mutable default {type(f.default)} for field {name} is not allowed: "
            "use default_factory"
        )
    return f


def _check_default_order(spec: Spec) -> None:
    seen_default = False
    for f in spec.fields:
        if f.init and f.has_default:
            seen_default = True
        elif f.init and seen_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")


def _set_class_defaults(cls: type, spec: Spec) -> None:
    """A non-slotted class keeps plain defaults as class attributes, not field() objects."""
    for f in spec.fields:
        if isinstance(cls.__dict__.get(f.name), Field):
            if f.default is MISSING:
                delattr(cls, f.name)
            else:
                setattr(cls, f.name, f.default)


def _slotted(cls: type, spec: Spec, namespace: dict[str, object]) -> type:
    """A new class with ``__slots__`` for the fields, no __dict__ and no __weakref__."""
    if "__slots__" in cls.__dict__:
        raise TypeError(f"{cls.__name__} already specifies __slots__")
    inherited: set[str] = set()
    for base in cls.__mro__[1:-1]:
        slots = base.__dict__.get("__slots__", ())
        inherited.update((slots,) if isinstance(slots, str) else slots)
    body = dict(cls.__dict__)
    for name in (*spec.names, "__dict__", "__weakref__"):
        body.pop(name, None)
    body.update(namespace)
    body["__slots__"] = tuple(name for name in spec.names if name not in inherited)
    body["__qualname__"] = cls.__qualname__
    return type(cls)(cls.__name__, cls.__bases__, body)


# -- generated methods ----------------------------------------------------------------------------


def _namespace(cls: type, spec: Spec) -> dict[str, object]:
    """Every class attribute we set except ``__init__`` (made once the final class exists)."""
    own = cls.__dict__
    new: dict[str, Any] = {k: v for k, v in _unless_defined(spec).items() if k not in own}
    # The stdlib keeps an explicit __hash__, but not the None that an __eq__ in the body implies.
    class_hash = own.get("__hash__", MISSING)
    if spec.eq and (class_hash is MISSING or (class_hash is None and "__eq__" in own)):
        hashed = tuple(f.name for f in spec.fields if (f.compare if f.hash is None else f.hash))
        new["__hash__"] = _make_hash(getter(hashed)) if spec.frozen else None
    if spec.frozen:
        new.update(_make_frozen(cls, spec))
    for name, method in new.items():
        if callable(method):  # not __match_args__, nor a __hash__ of None
            method.__qualname__ = f"{cls.__qualname__}.{name}"
    new[SPEC_ATTR] = spec
    new.update(lazy_attributes(cls, spec))
    if _PY313 and "__replace__" not in own:
        new["__replace__"] = replace  # what the stdlib adds for copy.replace() (shared)
    return new


def _unless_defined(spec: Spec) -> dict[str, object]:
    """What the class gets unless its body defines the name."""
    new: dict[str, object] = {
        "__repr__": _make_repr(tuple(f.name for f in spec.fields if f.repr)),
        "__match_args__": spec.init_names,
    }
    if spec.eq:
        new["__eq__"] = _make_eq(getter(tuple(f.name for f in spec.fields if f.compare)))
    if spec.frozen and spec.slots:
        new.update(make_state(spec.names))
    return new


def _make_repr(names: tuple[str, ...]) -> Callable[[object], str]:
    get = getter(names)
    template = ", ".join(f"{name}=%r" for name in names)  # field names hold no "%"
    running: set[tuple[int, int]] = set()

    def __repr__(self: object) -> str:
        key = (id(self), get_ident())  # reprlib.recursive_repr's guard, as in the stdlib
        if key in running:
            return "..."
        running.add(key)
        try:
            body = template % get(self)
        finally:
            running.discard(key)
        return f"{self.__class__.__qualname__}({body})"

    return __repr__


def _make_eq(get: Getter) -> Callable[[object, object], object]:
    if _PY313:  # "self.a == other.a and ...": the first false result, as it is

        def __eq__(self: object, other: object) -> object:
            if self is other:
                return True
            if other.__class__ is self.__class__:
                result: object = True
                for mine, theirs in zip(get(self), get(other), strict=False):  # same length
                    result = mine == theirs
                    if not result:
                        break
                return result
            return NotImplemented

    else:  # "(self.a, ...) == (other.a, ...)"

        def __eq__(self: object, other: object) -> object:
            if other.__class__ is self.__class__:
                return get(self) == get(other)
            return NotImplemented

    return __eq__


def _make_hash(get: Getter) -> Callable[[object], int]:
    def __hash__(self: object) -> int:
        return hash(get(self))

    return __hash__


def _make_frozen(cls: type, spec: Spec) -> dict[str, Callable[..., None]]:
    for name in ("__setattr__", "__delattr__"):
        if name in cls.__dict__:
            raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
    names = frozenset(spec.names)

    def __setattr__(self: object, name: str, value: object) -> None:
        final: Any = spec.cls  # the final class: read at call time
        if type(self) is final or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(final, self).__setattr__(name, value)

    def __delattr__(self: object, name: str) -> None:
        final: Any = spec.cls
        if type(self) is final or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(final, self).__delattr__(name)

    return {"__setattr__": __setattr__, "__delattr__": __delattr__}
