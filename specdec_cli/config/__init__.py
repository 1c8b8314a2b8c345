"""Configuration: typed schema, Hydra registration, composition, support matrix, validation."""
