"""Names of a package imported on first use (PEP 562), for packages whose ``import`` must stay
cheap: ``import xpulaunch`` loads no supervisor, ``xpulaunch.probing`` no probe, and the
masks package only the vendor module a name comes from.

    __getattr__, __dir__ = exports(globals(), {"name": "package.module", ...})
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, MutableMapping


def exports(
    namespace: MutableMapping[str, object], module_of: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The package's ``__getattr__`` (imports the module a name lives in, then keeps the
    value as a plain attribute of the package) and its ``__dir__``."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> object:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        # __import__, not importlib.import_module: the same import, but through the
        # interpreter's own path, which -X importtime reports (tests read it).
        value = getattr(__import__(module, fromlist=[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *module_of})

    return __getattr__, __dir__
