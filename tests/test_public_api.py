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
    from gpufeed.data.augment import Augment

    assert gpufeed.data.Augment is Augment  # an error message names it so


def test_gpufeed_data_is_there_after_import_gpufeed():
    # the README's `Loader(data, **gpufeed.data.load_settings(path))` after `import gpufeed`
    import subprocess
    import sys

    code = "import gpufeed; gpufeed.data.load_settings; gpufeed.data.Augment"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_every_public_name_of_the_feed_resolves_to_its_home():
    from gpufeed.data.indexer import index_shards
    from gpufeed.data.tar_scan import ShardError
    from gpufeed.data.worker_errors import LoaderWorkerError

    assert all(getattr(gpufeed.data, name) is not None for name in gpufeed.data.__all__)
    assert gpufeed.data.index_shards is index_shards and gpufeed.data.ShardError is ShardError
    assert gpufeed.data.LoaderWorkerError is LoaderWorkerError


def test_the_readme_and_examples_go_through_the_public_facades():
    """Module paths inside `gpufeed.data` are internal: what users copy names only the facade."""
    import re
    from pathlib import Path

    root = Path(gpufeed.__file__).parents[2]
    texts = [root / "README.md", *sorted((root / "examples").glob("*.py"))]
    inside = re.compile(r"\bgpufeed\.data\.([A-Za-z_]+)\b")
    found = {
        str(p.relative_to(root)): set(inside.findall(p.read_text())) - set(gpufeed.data.__all__)
        for p in texts
    }
    assert all(not names for names in found.values()), found
