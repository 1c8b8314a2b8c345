"""The method table is the method list: conf/, the matrix and the drafter registry all agree with it."""
from __future__ import annotations

from specdec_cli.config.compose import CONF_DIR
from specdec_cli.config.matrix import MATRIX, METHODS
from specdec_cli.config.methods import FAMILIES, TABLE, method_names
from specdec_cli.drafters import DRAFTERS


def test_every_method_has_its_option_schema_drafter_and_matrix_column() -> None:
    assert {p.stem for p in (CONF_DIR / "method").glob("*.yaml")} == set(TABLE)
    assert set(DRAFTERS.names()) == set(TABLE)
    assert METHODS == method_names()
    for name, spec in TABLE.items():
        assert spec.schema().name == name and spec.family in FAMILIES
        assert all(name in row for row in MATRIX.values())


def test_families_partition_the_methods() -> None:
    assert sorted(sum((method_names(family) for family in FAMILIES), ())) == sorted(TABLE)
    assert method_names("none") == ("none",)
    assert all(TABLE[name].family == "model" for name in TABLE if TABLE[name].trainable)
