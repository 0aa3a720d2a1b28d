"""The public API: a small set of names, none of which is also the name of a submodule."""

from __future__ import annotations

import importlib
import pkgutil

import gpufeed
import gpufeed.data


def _submodule_names(package) -> set[str]:
    return {m.name for m in pkgutil.iter_modules(package.__path__)}


def test_no_public_name_is_also_a_submodule():
    for package in (gpufeed, gpufeed.data):
        clashes = set(package.__all__) & _submodule_names(package)
        assert not clashes, f"{package.__name__} exports {clashes}, which are also submodules"


def test_importing_every_submodule_leaves_the_public_functions_in_place():
    for info in pkgutil.walk_packages(gpufeed.__path__, "gpufeed."):
        if ".integrations." in info.name or info.name.endswith("sitecustomize"):
            continue  # optional third-party frameworks; the bootstrap runs at interpreter start
        importlib.import_module(info.name)
    assert callable(gpufeed.profile) and callable(gpufeed.analyze) and callable(gpufeed.load)
    assert callable(gpufeed.data.pack)
    from gpufeed.data.loader import Loader

    assert gpufeed.data.Loader is Loader
