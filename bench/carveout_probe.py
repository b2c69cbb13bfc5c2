"""Feasibility probe (v75): can the decode of the scratch path hide under cuBLAS at M = 2048 if
cuBLAS is told to leave a few SMs free (torch._C._set_sm_carveout_experimental) and the decode
runs as a persistent kernel on just those SMs?

It pays only if a few SMs move a decode's bytes much faster per SM than the full-GPU decode
(~3.1 TB/s / 132 SMs = 23 GB/s an SM): the carveout slows cuBLAS by ~132 / (132 - c).

Measures, 14336 x 4096 bf16, M = 2048, medians over rotated input sets:
  1. torch.mm with carveout c in {0, 4, 8, 12, 16} (is it honoured, what it costs);
  2. a stand-in decode (Triton, persistent, P programs: u8 nibble pairs -> bf16, the q4 byte
     ratio) alone, for P in {4, 8, 12, 16, 132 x 4}: GB/s;
  3. mm (carveout c) on one stream beside the stand-in decode of 70 % of the rows (P = c) on
     another: the wall time against mm alone.
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl


@triton.jit
def _unpack_persistent(p_ptr, o_ptr, n_tiles, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    for j in range(0, tl.cdiv(n_tiles - pid, nprog)):
        t = pid + j * nprog
        p = tl.load(p_ptr + t * BLOCK + offs)
        lo = (p & 15).to(tl.float32).to(tl.bfloat16)
        hi = (p >> 4).to(tl.float32).to(tl.bfloat16)
        tl.store(o_ptr + t * (2 * BLOCK) + tl.arange(0, 2 * BLOCK), tl.interleave(lo, hi))


def unpack(packed: torch.Tensor, out: torch.Tensor, programs: int, block: int, warps: int) -> None:
    n_tiles = packed.numel() // block
    _unpack_persistent[(min(programs, n_tiles),)](packed, out, n_tiles, BLOCK=block, num_warps=warps)


def timed(fn, sets: int, reps: int) -> float:
    """Median µs of fn(i) with i rotating over the input sets."""
    for i in range(sets):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for r in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(r % sets)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--N", type=int, default=14336)
    ap.add_argument("--K", type=int, default=4096)
    ap.add_argument("--M", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sets", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    N, K, M, S = args.N, args.K, args.M, args.sets
    dev = "cuda"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    xs = [torch.randn(M, K, device=dev, dtype=torch.bfloat16) for _ in range(S)]
    ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(S)]
    ys = [torch.empty(M, N, device=dev, dtype=torch.bfloat16) for _ in range(S)]
    n_dec = (int(N * 0.7) // 128) * 128
    packed = [torch.randint(0, 256, (n_dec * K // 2,), device=dev, dtype=torch.uint8) for _ in range(S)]
    outs = [torch.empty(n_dec * K, device=dev, dtype=torch.bfloat16) for _ in range(S)]
    dec_bytes = n_dec * K // 2 + n_dec * K * 2
    unpack(packed[0], outs[0], 8, 8192, 16)
    ref = torch.stack([packed[0] & 15, packed[0] >> 4], 1).reshape(-1).to(torch.bfloat16)
    print("stand-in decode matches:", torch.equal(outs[0], ref), flush=True)
    del ref
    res: dict = {"N": N, "K": K, "M": M, "sms": sms, "mm": {}, "decode": {}, "overlap": {}}

    for lib in ("default", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(lib)
        for c in (0, 4, 8, 12, 16):
            torch._C._set_sm_carveout_experimental(c if c else None)
            t = timed(lambda i: torch.mm(xs[i], ws[i].t(), out=ys[i]), S, args.reps)
            res["mm"][f"{lib}/c{c}"] = t
            print(f"mm {lib:8s} carveout {c:2d}: {t:7.1f} us  ({2 * M * N * K / t / 1e6:.0f} TFLOP/s)", flush=True)
    torch._C._set_sm_carveout_experimental(None)
    torch.backends.cuda.preferred_blas_library("default")

    for block, warps in ((4096, 8), (8192, 16), (16384, 32)):
        for p in (4, 8, 12, 16, 4 * sms):
            t = timed(lambda i: unpack(packed[i], outs[i], p, block, warps), S, args.reps)
            res["decode"][f"b{block}w{warps}/p{p}"] = t
            print(f"decode block {block:5d} warps {warps:2d} programs {p:3d}: {t:7.1f} us "
                  f"{dec_bytes / t / 1e3:7.0f} GB/s ({dec_bytes / t / 1e3 / min(p, sms):5.0f} an SM)", flush=True)

    side = torch.cuda.Stream()
    for lib in ("default", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(lib)
        for c in (4, 8, 12, 16):
            for block, warps in ((8192, 16), (16384, 32)):
                torch._C._set_sm_carveout_experimental(c)

                def both(i: int) -> None:
                    main_s = torch.cuda.current_stream()
                    side.wait_stream(main_s)
                    torch.mm(xs[i], ws[i].t(), out=ys[i])
                    with torch.cuda.stream(side):
                        unpack(packed[i], outs[i], c, block, warps)
                    main_s.wait_stream(side)

                t = timed(both, S, args.reps)
                res["overlap"][f"{lib}/c{c}/b{block}w{warps}"] = t
                alone = res["mm"][f"{lib}/c{c}"]
                print(f"mm {lib:8s} c{c:2d} + decode(70 %) on {c} programs b{block} w{warps}: {t:7.1f} us "
                      f"(mm alone {alone:.1f}, mm c0 {res['mm'][f'{lib}/c0']:.1f})", flush=True)
    torch._C._set_sm_carveout_experimental(None)
    torch.backends.cuda.preferred_blas_library("default")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
