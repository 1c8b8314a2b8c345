"""Self-distillation of drafters: target-generated data, features, training."""
