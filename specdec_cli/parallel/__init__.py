"""Parallelism on torch.distributed: tensor parallelism (TP) and attention data parallelism (ADP).

- ``launch`` / ``worker``: spawn torchrun-compatible ranks on this machine and watch them;
- ``context``: one rank's environment, process group (gloo / NCCL), timeouts and store;
- ``partition`` / ``shard`` / ``layers``: how a loaded ``Transformer`` is split for one TP rank;
- ``gather`` / ``comm``: the gather policy for vocab-sharded logits and the counted collectives;
- ``drafters``: drafters on a TP rank (sharded with the target, or replicated);
- ``merge``: ADP shares merged into one result on rank 0.

The job that runs on the ranks is ``specdec_cli.run.ranks``; nothing here imports it back.
Nothing is imported here: importing a submodule does not pull in the engine or the models.
"""
