"""A package face's PEP 562 exports: a name is imported from its module on first use.

    __getattr__, __dir__ = exports(globals(), {"package.module": ("name", ...), ...})

The faces that re-export names use it (``xpulaunch``, ``xpulaunch.leases``,
``xpulaunch.llamacpp``): ``import xpulaunch`` to plan a job should not import the supervisor,
the probes or llama-server's HTTP client, and importing one pure module of a package should
not load its siblings. Inside the package, modules import each other by their full names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, MutableMapping


def exports(
    namespace: MutableMapping[str, object], table: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The package's ``__getattr__`` (imports the module a name lives in, then keeps the
    value as a plain attribute of the package) and its ``__dir__`` (the table's names)."""
    package = namespace["__name__"]
    module_of = {name: module for module, names in table.items() for name in names}

    def __getattr__(name: str) -> object:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        # The public names and the module's dunders; not the helpers and submodules that
        # happen to be attributes.
        return sorted({*module_of, *(n for n in namespace if n.startswith("__"))})

    return __getattr__, __dir__
