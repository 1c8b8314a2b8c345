"""Parallelism on torch.distributed: tensor parallelism (TP) and attention data parallelism (ADP).

- ``job``: what ``specdec run`` hands a ``tp > 1`` / ``dp > 1`` run to (launch or join the ranks,
  then TP or ADP on each rank);
- ``launch`` / ``worker``: spawn torchrun-compatible ranks on this machine and watch them;
- ``context``: one rank's environment, process group (gloo / NCCL), timeouts and store;
- ``partition`` / ``shard`` / ``layers``: how a loaded ``Transformer`` is split for one TP rank;
- ``gather`` / ``comm``: the gather policy for vocab-sharded logits and the counted collectives;
- ``drafters``: drafters on a TP rank (sharded with the target, or replicated);
- ``merge``: ADP shares merged into one result on rank 0.

Nothing is imported here: importing a submodule does not pull in the engine or the models.
"""
