"""Registers the typed schema in Hydra's ConfigStore; the only ConfigStore user.

Every ``conf/<group>/<option>.yaml`` extends one schema stored here as ``base_<key>``:
method options extend ``base_<method>`` (one dataclass per method), ``model=hf`` extends
``base_hf`` (its path is required), every other option ``base_<group>``;
``conf/config.yaml`` extends ``base_config`` (``RunConfig``), ``conf/train.yaml`` extends
``base_train_config`` (``config/train_root.py``'s flat schema over every method's train schema).
Call ``register_configs()`` before composing (the CLI and the test conftest do).
"""
from __future__ import annotations

from hydra.core.config_store import ConfigStore

from specdec_cli.config.methods import method_schemas
from specdec_cli.config.schema import (
    HfModelConfig,
    ModelConfig,
    ParallelismConfig,
    RejectionConfig,
    RunConfig,
    SamplerConfig,
    TrainConfig,
    WorkloadConfig,
)
from specdec_cli.config.train_root import train_root_schema

# group -> {key: schema}, each stored as ``base_<key>`` in that group
SCHEMAS: dict[str, dict[str, type]] = {
    "method": method_schemas(),
    "sampler": {"sampler": SamplerConfig},
    "rejection": {"rejection": RejectionConfig},
    "parallelism": {"parallelism": ParallelismConfig},
    "model": {"model": ModelConfig, "hf": HfModelConfig},
    "workload": {"workload": WorkloadConfig},
}


def register_configs() -> None:
    """Store the root schema and one schema per group option (idempotent)."""
    store = ConfigStore.instance()
    store.store(name="base_config", node=RunConfig)
    for group, schemas in SCHEMAS.items():
        for key, node in schemas.items():
            store.store(group=group, name=f"base_{key}", node=node)


def register_train_configs(train_schemas: dict[str, type[TrainConfig]]) -> None:
    """``register_configs`` plus ``specdec train``'s root over ``train_schemas`` (method -> train schema)."""
    register_configs()
    ConfigStore.instance().store(name="base_train_config", node=train_root_schema(train_schemas))
