"""The cost of one chain verification call: ``rejection_sample`` (token rule) vs ``block_verify``, random target and
draft rows of the embedded target's vocabulary (49,152), 2 threads, steady state (warm-up calls excluded).

Usage: chrt -f 5 .venv/bin/python benchmarks/bench_block_verify.py
"""
import time, torch
from specdec_cli.sampling import block_verify, rejection_sample
torch.set_num_threads(2)
V=49152
for B, K in [(1, 4), (2, 4), (1, 8)] * 2:  # the first pass warms up (its first cell pays 1-2 ms a call)
    t = torch.rand(B, K + 1, V).softmax(-1); d = torch.rand(B, K, V).softmax(-1)
    tok = torch.multinomial(d.reshape(-1, V), 1).view(B, K)
    for name, fn in [("token", rejection_sample), ("block", block_verify)]:
        g = [torch.Generator().manual_seed(0) for _ in range(B)]
        for _ in range(300): fn(t, d, tok, generators=g)
        n = 1000; start = time.perf_counter()
        for _ in range(n): fn(t, d, tok, generators=g)
        print(B, K, name, f"{(time.perf_counter() - start) / n * 1e3:.3f} ms")
