"""The device-independent parts of the CUDA-graph path: buckets, the flag's resolution, static-input padding
(unused rows on the scratch slot) and the eager fallback on CPU."""
from __future__ import annotations

import pytest
import torch

from specdec_cli.engine.cuda_graphs import GraphRunner, StaticInputs, bucket_for, resolve_cuda_graphs


@pytest.mark.parametrize(("batch", "bucket"), [(1, 1), (2, 2), (3, 4), (5, 8), (16, 16), (17, None), (0, None)])
def test_the_smallest_bucket_that_holds_the_batch(batch: int, bucket) -> None:
    assert bucket_for(batch) == bucket


def test_the_flag_resolves_to_off_on_cpu() -> None:
    assert not resolve_cuda_graphs("auto", "cpu") and not resolve_cuda_graphs("off", "cuda")
    assert resolve_cuda_graphs("auto", "cuda") and resolve_cuda_graphs("on", "cuda")


def test_static_inputs_pad_with_the_scratch_slot() -> None:
    static = StaticInputs.allocate(4, 3, scratch_slot=9, device="cpu")
    assert static.slots.tolist() == [9] * 4  # warm-up and capture touch the scratch slot only
    static.fill(torch.tensor([[1, 2, 3], [4, 5, 6]]), [0, 5], [10, 20], scratch_slot=9)
    assert static.token_ids.tolist() == [[1, 2, 3], [4, 5, 6], [0, 0, 0], [0, 0, 0]]
    assert static.slots.tolist() == [0, 5, 9, 9] and static.positions.tolist() == [10, 20, 0, 0]
    with pytest.raises(ValueError):
        static.fill(torch.zeros(5, 3, dtype=torch.int64), [0] * 5, [0] * 5, scratch_slot=9)


def test_cpu_runs_eagerly_even_when_enabled() -> None:
    seen = []
    runner = GraphRunner(lambda s: seen.append(s.slots.tolist()) or s.token_ids * 2, scratch_slot=7,
                         device=torch.device("cpu"), enabled=True)
    out = runner(torch.tensor([[1, 2]]), [3], [4])
    assert not runner.enabled and runner.eager_runs == 1 and runner.replays == 0
    assert out.tolist() == [[2, 4]] and seen == [[3]]


def test_cuda_graphs_on_without_cuda_is_refused() -> None:
    from specdec_cli.config.compose import compose_config
    from specdec_cli.config.hardware import Hardware
    from specdec_cli.config.validate import resolve
    from specdec_cli.errors import ConfigError

    cpu = Hardware(cuda=False, flashinfer_problem="no CUDA")
    assert not resolve(compose_config(["engine.cuda_graphs=auto"]), cpu).cuda_graphs
    with pytest.raises(ConfigError, match="engine.cuda_graphs=on needs a CUDA device"):
        resolve(compose_config(["engine.cuda_graphs=on"]), cpu)
    cuda = Hardware(cuda=True, flashinfer_problem="not installed")
    assert resolve(compose_config(["engine.cuda_graphs=auto", "model.device=cuda"]), cuda).cuda_graphs
