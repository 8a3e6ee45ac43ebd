"""Where :mod:`xpulaunch._dataclass_runtime` meets the stdlib's ``dataclasses`` and ``typing``.

The one module of the three that touches them, and only when the caller already has them:

- ``ClassVar``, ``InitVar`` and ``KW_ONLY`` annotations are recognised once typing or
  dataclasses is loaded (nothing can name them before);
- ``dataclasses.fields/asdict/replace/is_dataclass``, ``inspect.signature`` and ``__doc__`` read
  lazy class attributes that import dataclasses (or inspect) on first access and build the
  answer from a stdlib twin made with ``dataclasses.make_dataclass`` (public API only);
- our ``replace()`` hands a stdlib dataclass instance to ``dataclasses.replace``.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from typing import Any

    from xpulaunch._dataclass_runtime import Field, Spec

TWIN_ATTR = "__xpulaunch_twin__"  # the stdlib twin, kept on the class once made


def is_classvar(annotation: object, cls: type, name: str) -> bool:
    """ClassVar: skipped; InitVar, KW_ONLY: a TypeError. Nothing can name them before typing
    or dataclasses is loaded, and then we need not resolve anything."""
    typing, stdlib = sys.modules.get("typing"), sys.modules.get("dataclasses")
    if typing is None and stdlib is None:
        return False
    target = _resolve(annotation, cls)
    if stdlib is not None and (
        target is stdlib.KW_ONLY or target is stdlib.InitVar or type(target) is stdlib.InitVar
    ):
        raise TypeError(f"{cls.__name__}.{name}: InitVar and KW_ONLY are not supported")
    return typing is not None and target is typing.ClassVar


def _resolve(annotation: object, cls: type) -> object:
    """What an annotation's head ("ClassVar", "typing.ClassVar") names: for a string, looked
    up in the class's module globals only, as the stdlib's ``_is_type`` does."""
    if not isinstance(annotation, str):
        return getattr(annotation, "__origin__", annotation)
    namespace: dict[str, object] = getattr(sys.modules.get(cls.__module__), "__dict__", {})
    owner, _, name = annotation.split("[", 1)[0].strip().rpartition(".")
    if owner:
        return getattr(namespace.get(owner.strip()), name.strip(), None)
    return namespace.get(name)


def stdlib_replace(obj: object, changes: dict[str, object]) -> object:
    """``dataclasses.replace`` for an instance of a stdlib dataclass, else a TypeError."""
    stdlib = sys.modules.get("dataclasses")  # a stdlib dataclass implies it is loaded
    if stdlib is not None and stdlib.is_dataclass(obj) and not isinstance(obj, type):
        return stdlib.replace(obj, **changes)
    raise TypeError("replace() should be called on dataclass instances")


def lazy_attributes(cls: type, spec: Spec) -> dict[str, object]:
    """The stdlib's class attributes, as descriptors that build them on first access."""
    lazy: dict[str, object] = {
        name: _Lazy(name, spec) for name in ("__dataclass_fields__", "__dataclass_params__")
    }
    if spec.our_init:
        lazy["__signature__"] = _Signature(spec)
    if not cls.__doc__:
        lazy["__doc__"] = _Lazy("__doc__", spec)  # the stdlib's: "Name(signature)"
    return lazy


class _Lazy:
    """``__dataclass_fields__``, ``__dataclass_params__`` (from the twin) or ``__doc__``:
    computed on first access, through the class or an instance, then set on the class in place
    of this descriptor (the type reads a descriptor for ``__doc__`` too). Whoever reads one is
    about to use dataclasses or inspect anyway."""

    __slots__ = ("attr", "spec")

    def __init__(self, attr: str, spec: Spec) -> None:
        self.attr, self.spec = attr, spec

    def __get__(self, instance: object, owner: type | None = None) -> object:
        cls = self.spec.cls
        value = _doc(cls) if self.attr == "__doc__" else getattr(_twin(self.spec), self.attr)
        type.__setattr__(cls, self.attr, value)
        return value


class _Signature:
    """``__signature__``, which ``inspect.signature`` reads since our ``__init__`` takes
    ``*args, **kwargs``. It stays a descriptor: it is the class's own signature only, None for
    instances and for subclasses, which may define their own ``__init__`` (``inspect.signature``
    then looks further)."""

    __slots__ = ("signature", "spec")

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.signature: object = None

    def __get__(self, instance: object, owner: type | None = None) -> object:
        if instance is not None or owner is not self.spec.cls:
            return None
        if self.signature is None:
            import inspect

            self.signature = inspect.signature(_twin(self.spec))
        return self.signature


def _doc(cls: type) -> str:
    """The stdlib's docstring for a class without one."""
    import inspect

    try:
        return cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
    except (TypeError, ValueError):  # as the stdlib: "some signatures cannot be computed"
        return cls.__name__


def _twin(spec: Spec) -> type:
    """The stdlib dataclass with the fields of ``spec.cls`` (made once, kept on the class)."""
    twin: type | None = spec.cls.__dict__.get(TWIN_ATTR)
    if twin is None:
        import dataclasses

        fields = [(f.name, f.type, _stdlib_field(dataclasses, f)) for f in spec.fields]
        twin = dataclasses.make_dataclass(spec.cls.__name__, fields, eq=spec.eq, frozen=spec.frozen)
        type.__setattr__(spec.cls, TWIN_ATTR, twin)
    return twin


def _stdlib_field(dataclasses: Any, f: Field) -> object:
    flags = {"init": f.init, "repr": f.repr, "hash": f.hash, "compare": f.compare}
    if f.has_factory:
        return dataclasses.field(default_factory=f.default_factory, **flags)
    if f.has_default:
        return dataclasses.field(default=f.default, **flags)
    return dataclasses.field(**flags)
