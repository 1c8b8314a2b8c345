"""Corpus v2 for self-distillation: task families, their sources, self-written instructions, generation."""
