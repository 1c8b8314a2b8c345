"""Registry: register by name, get by name, unknown names list the known ones."""
from __future__ import annotations

import pytest

from specdec_cli.errors import SpecdecError
from specdec_cli.registry import Registry


def test_register_get_names() -> None:
    drafters: Registry[type] = Registry("drafter")

    @drafters.register("ngram")
    class Ngram:
        pass

    drafters.register("eagle3")(dict)
    assert drafters.get("ngram") is Ngram
    assert drafters.names() == ["eagle3", "ngram"]
    with pytest.raises(SpecdecError, match=r"unknown drafter 'medusa' \(known: eagle3, ngram\)"):
        drafters.get("medusa")
    with pytest.raises(ValueError, match="already registered"):
        drafters.register("ngram")(dict)
