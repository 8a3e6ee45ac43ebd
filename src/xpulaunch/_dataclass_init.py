"""How instances of a class decorated by :mod:`xpulaunch._dataclass_runtime` get their fields:
its ``__init__``, and the ``__getstate__``/``__setstate__`` that pickle and copy use.

``__init__`` is one closure per class over tuples computed at decoration time, instead of the
stdlib's exec()ed ``def __init__(self, a, b=1)``. A call with every init field given by position
skips binding (the engine builds one status object per worker on each loop iteration). Other
calls are bound as CPython binds that ``def``, with its TypeErrors. Two differences from the
stdlib: the signature is ``(self, /, *args, **kwargs)`` (``inspect.signature`` reads the class's
``__signature__`` instead, see :mod:`xpulaunch._dataclass_compat`), and the init fields are set
before the non-init ones (only the order in which default factories run can differ).
"""

from __future__ import annotations

from _operator import attrgetter  # operator's C half: operator.py is not loaded at start-up

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from xpulaunch._dataclass_runtime import Field, Spec

    Getter = Callable[[object], tuple[object, ...]]
    Binder = Callable[[tuple[object, ...], dict[str, object]], list[object]]
    Setter = Callable[[object, str, object], None]


class _Slotted:
    __slots__ = ("slot",)


MEMBER_DESCRIPTOR = type(_Slotted.__dict__["slot"])  # types.MemberDescriptorType, without types
_REQUIRED, _FACTORY = object(), object()  # what an absent argument binds to, for now


def make_init(spec: Spec, cls: type) -> Callable[..., None]:
    """``cls.__init__(self, /, *args, **kwargs)``; ``cls`` is the final (maybe slotted) class."""
    names = spec.init_names
    n_init = len(names)
    qualname = f"{cls.__qualname__}.__init__"
    bind = _binder(tuple(f for f in spec.fields if f.init), f"{qualname}()")
    set_: Setter = object.__setattr__ if spec.frozen else setattr  # the stdlib's choice
    # Slot setters bypass __setattr__: fine when frozen (the stdlib bypasses it too) or when
    # no class of the MRO defines one.
    fast = spec.frozen or all("__setattr__" not in k.__dict__ for k in cls.__mro__[:-1])
    setters = _slot_setters(cls, names) if fast else None
    finish = _finisher(spec, cls, set_)

    def __init__(self: object, /, *args: object, **kwargs: object) -> None:
        values = bind(args, kwargs) if kwargs or len(args) != n_init else args
        # n_init values here; zip(strict=True) would cost a third of a fast-path call.
        if setters is None:
            for name, value in zip(names, values, strict=False):
                set_(self, name, value)
        else:
            for setter, value in zip(setters, values, strict=False):
                setter(self, value)
        if finish is not None:
            finish(self)

    __init__.__qualname__ = qualname
    return __init__


def getter(names: tuple[str, ...]) -> Getter:
    """``self -> (self.a, ...)``: always a tuple, as the stdlib's generated code builds."""
    if len(names) > 1:
        get: Getter = attrgetter(*names)
        return get
    if names:
        one = attrgetter(names[0])
        return lambda self: (one(self),)
    return lambda self: ()


def make_state(names: tuple[str, ...]) -> dict[str, Callable[..., object]]:
    """Pickle/copy of a frozen slotted class, with the stdlib's list-of-values state: the
    default state would be restored through the frozen ``__setattr__``."""
    get = getter(names)

    def __getstate__(self: object) -> list[object]:
        return list(get(self))

    def __setstate__(self: object, state: list[object]) -> None:
        for name, value in zip(names, state, strict=False):  # as the stdlib's zip()
            object.__setattr__(self, name, value)

    return {"__getstate__": __getstate__, "__setstate__": __setstate__}


def _finisher(spec: Spec, cls: type, set_: Setter) -> Callable[[Any], None] | None:
    """What ``__init__`` does after the init fields: non-init fields, then ``__post_init__``.
    None when there is nothing to do. A non-slotted class keeps plain defaults on the class."""
    rest = tuple(
        (f.name, f.default_factory if f.has_factory else f.default, f.has_factory)
        for f in spec.fields
        if not f.init and (f.has_factory or (spec.slots and f.has_default))
    )
    post_init = hasattr(cls, "__post_init__")
    if not rest and not post_init:
        return None

    def finish(self: Any) -> None:
        for name, value, is_factory in rest:
            set_(self, name, value() if is_factory else value)  # type: ignore[operator]
        if post_init:
            self.__post_init__()

    return finish


def _slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[..., None], ...] | None:
    """The fields' slot descriptors' ``__set__`` (faster than object.__setattr__), or None
    when a field is not a slot (a non-slotted class, a field of a non-slotted base)."""
    setters = []
    for name in names:
        slot = next((k.__dict__[name] for k in cls.__mro__ if name in k.__dict__), None)
        if not isinstance(slot, MEMBER_DESCRIPTOR):
            return None
        setters.append(slot.__set__)
    return tuple(setters)


def _binder(fields: tuple[Field, ...], qualname: str) -> Binder:
    """Binds arguments as CPython binds ``def __init__(self, a, b=1)``, with its TypeErrors.
    Factories run only once the call is known to be valid, as in the stdlib."""
    names = tuple(f.name for f in fields)
    defaults = tuple(_bound_default(f) for f in fields)
    tails = tuple((names[i:], defaults[i:]) for i in range(len(fields) + 1))
    factories = tuple(f.default_factory for f in fields)
    # Whether defaults[i:] has a marker that needs a second pass, for each i.
    marked = tuple(
        any(d is _REQUIRED or d is _FACTORY for d in defaults[i:]) for i in range(len(fields) + 1)
    )
    n_required = sum(not f.has_default for f in fields)

    def bind(args: tuple[object, ...], kwargs: dict[str, object]) -> list[object]:
        n_args = len(args)
        if n_args > len(fields):
            raise _arguments_error(qualname, names, args, kwargs, n_required)
        values = [*args, *map(kwargs.pop, *tails[n_args])]  # map: no Python-level loop
        if kwargs:
            raise _arguments_error(qualname, names, args, kwargs, n_required)
        if marked[n_args]:
            missing = [repr(name) for name, v in zip(names, values, strict=True) if v is _REQUIRED]
            if missing:
                raise TypeError(_missing(qualname, missing))
            for i in range(n_args, len(values)):
                if values[i] is _FACTORY:
                    values[i] = factories[i]()  # type: ignore[operator]
        return values

    return bind


def _bound_default(f: Field) -> object:
    if f.has_factory:
        return _FACTORY
    return f.default if f.has_default else _REQUIRED


def _arguments_error(
    qualname: str,
    names: tuple[str, ...],
    args: tuple[object, ...],
    kwargs: dict[str, object],
    n_required: int,
) -> TypeError:
    """CPython's first complaint: a keyword problem, else too many positional arguments."""
    for name in kwargs:
        if name in names:
            return TypeError(f"{qualname} got multiple values for argument {name!r}")
        return TypeError(f"{qualname} got an unexpected keyword argument {name!r}")
    n_init = len(names)
    takes = f"from {n_required + 1} to {n_init + 1}" if n_required < n_init else str(n_init + 1)
    plural = "" if takes == "1" else "s"
    return TypeError(
        f"{qualname} takes {takes} positional argument{plural} but {len(args) + 1} were given"
    )


def _missing(qualname: str, quoted: list[str]) -> str:
    listed = ", ".join(quoted[:-1]) + ("," if len(quoted) > 2 else "") + " and " + quoted[-1]
    counted = f"{len(quoted)} required positional argument{'s' if len(quoted) > 1 else ''}"
    return f"{qualname} missing {counted}: {quoted[0] if len(quoted) == 1 else listed}"
