"""A package's exported name never turns into a submodule of the same name: once Python imports
`pkg.name` it binds the submodule as the package's attribute `name`, and a lazy re-export of a
function `name` is then shadowed (`from headscope.circuits import attribute` returned the
module). Every package's submodules are imported first, then every name in `__all__` checked."""
import importlib
import pkgutil
import types

import headscope


def _packages():
    yield headscope
    for info in pkgutil.walk_packages(headscope.__path__, "headscope."):
        if info.ispkg:
            yield importlib.import_module(info.name)


def test_no_exported_name_is_shadowed_by_a_submodule():
    shadowed = []
    for package in list(_packages()):
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
        for name in getattr(package, "__all__", ()):
            if isinstance(getattr(package, name), types.ModuleType):
                shadowed.append(f"{package.__name__}.{name}")
    assert not shadowed
