"""The job of ``specdec run``: build the pipeline, run it, write its results.

- ``pipeline``: ``build_pipeline`` -> ``Pipeline`` (target, tokenizer, drafter, engine, requests),
  the one build for a single process and for every parallel rank;
- ``drive``: ``run_requests``, the engine drive loop (with an optional progress bar);
- ``job``: ``run_job`` -> ``RunResult`` (``result``), single-process or handed to ``ranks``;
- ``ranks``: a parallel job (tensor parallelism, attention data parallelism) on its ranks;
- ``outputs``: the output directory's lock and results.json + outputs.jsonl written as a pair.

Nothing is imported here: ``drive`` can be used without loading the job's other modules.
"""
