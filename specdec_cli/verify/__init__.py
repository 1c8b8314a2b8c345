"""Losslessness checks: does speculative decoding still sample from the target's law?

- ``stats``: chi-square goodness of fit + total variation against a calibrated bound (``fit``),
  also what the sampler and drafter tests use;
- ``lossless``: the per-position and joint tests of ``specdec verify`` and the Bonferroni verdict;
- ``samples``: many seeded continuations of one prompt through ``SpecEngine`` (shared prompt KV)
  and the target's conditional law given each sampled prefix;
- ``setup``: ``specdec verify``'s options, the configuration under test, the target and prompts;
- ``check``: ``verify`` -- sample both sides, test, judge.
"""
