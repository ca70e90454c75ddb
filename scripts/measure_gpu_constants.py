#!/usr/bin/env python3
"""The GPU constants kiln-profile reference takes from elsewhere until a GPU measures them (issue 52).

Run on a GPU (scripts/device_check.sh speed, step `gpu_constants`); writes one JSON object:

- context_bytes: what nvidia-smi shows (torch.cuda.device_memory_used) minus the caching
  allocator's reserved bytes, after a cuBLAS matmul, an SDPA call and their backward have loaded
  their kernels: the CUDA context as a training process holds it (cost/reference.h takes PyTorch
  PR 86509's 287,047,680 bytes until this is measured);
- host_seconds_per_op: Python's time to issue one small CUDA op (an add of two 1024-element
  tensors), 20,000 ops without a synchronisation, best of three: the host cost per op the reference
  stack's step pays on a GPU (configs/reference/host_costs.yaml measures it on a CPU);
- copy_bandwidth_fraction: a 1 GiB device copy's bytes per second over the hardware table's peak,
  where the GPU is in it;
- sdpa: forward + backward TFLOP/s of SDPA's flash and memory-efficient backends, causal, fp16,
  batch 1, 8 heads of 64 (llama3-100m's attention), T 1024 and 8192: the attention rate the
  roofline takes at the tensor-core peak.

Python is used here as the reference stack uses it; kiln itself never loads Python.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.attention
import torch.nn.functional as F


def timed(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", required=True, help="JSON file to write")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("measure_gpu_constants.py: no CUDA device")
    dev = torch.device("cuda")
    out: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}

    # Load the kernels a training step uses: a GEMM and SDPA, forward and backward.
    a = torch.randn(1024, 1024, device=dev, dtype=torch.float16, requires_grad=True)
    (a @ a).sum().backward()
    q = torch.randn(1, 8, 1024, 64, device=dev, dtype=torch.float16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    torch.cuda.synchronize()
    out["context_bytes"] = torch.cuda.device_memory_used() - torch.cuda.memory_reserved()

    x = torch.ones(1024, device=dev)
    y = torch.ones(1024, device=dev)

    def issue():
        for _ in range(20000):
            torch.add(x, y)

    out["host_seconds_per_op"] = timed(issue) / 20000

    src = torch.empty(1 << 28, device=dev)  # 1 GiB fp32
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), repeat=5)
    out["copy_bytes_per_second"] = 2 * src.numel() * 4 / seconds
    out["sdpa"] = []
    for backend, name in ((torch.nn.attention.SDPBackend.FLASH_ATTENTION, "flash"),
                          (torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION, "memory-efficient")):
        for t in (1024, 8192):
            qkv = [torch.randn(1, 8, t, 64, device=dev, dtype=torch.float16, requires_grad=True) for _ in range(3)]
            with torch.nn.attention.sdpa_kernel(backend):
                def step():
                    o = F.scaled_dot_product_attention(*qkv, is_causal=True)
                    o.backward(torch.ones_like(o))
                step()
                seconds = timed(step)
            # Causal: forward 2 products of T(T+1)/2 x 64 per head, backward 2.5x (the model's count).
            flops = 3.5 * 4 * 8 * t * (t + 1) / 2 * 64
            out["sdpa"].append({"backend": name, "T": t, "seconds": seconds, "tflops": flops / seconds / 1e12})
    with open(args.output, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
