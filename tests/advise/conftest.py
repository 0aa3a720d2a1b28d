"""Shared fixtures of the advise tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def loader_recipes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The `augment` of every gpufeed Loader made during the test, recorded on its way into the
    real Loader (a subclass that only records, put where `diagnose` and `tune` import it from)."""
    import gpufeed.data.loader

    recipes: list[Any] = []

    class Recording(gpufeed.data.loader.Loader):
        def __init__(self, *args: Any, augment: Any = None, **kwargs: Any) -> None:
            recipes.append(augment)
            super().__init__(*args, augment=augment, **kwargs)

    monkeypatch.setattr(gpufeed.data.loader, "Loader", Recording)
    return recipes
