"""v51: does path int8's ternary kernel go wrong when the GPU is shared? Calls it (and q4_0's, for
comparison) many times on fresh x against the float64 product of the same int8-rounded x, while a
second process (--load) keeps the GPU busy, and counts wrong outputs."""
import argparse
import sys
import time

import torch

sys.path.insert(0, "tests")
from gemm_helpers import int8_reference  # noqa: E402
from torch_uqr.triton_kernels.testing import random_packed, reference_dequantize  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--load", action="store_true", help="be the background load instead")
ap.add_argument("--iters", type=int, default=60)
args = ap.parse_args()
if args.load:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.time()
    while time.time() - t0 < 60:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        junk = torch.randint(-128, 127, (256 << 20,), dtype=torch.int8, device="cuda")  # dirty memory
        del junk
        torch.cuda.synchronize()
    sys.exit(0)
for fmt in ("ternary", "q4_0"):
    for N, K in ((256, 512), (4352, 1024)):
        w = random_packed(fmt, N, K, 0, seed=5, device="cuda")
        W = reference_dequantize(w.cpu(), fmt, N, K, 0)
        bad = 0
        for it in range(args.iters):
            x = torch.randn(*((1,) * (it % 2)), 1, K, device="cuda").to(torch.bfloat16)
            y = torch.ops.uqr._int8_cuda(x, w, fmt, N, K, 0, 0, False).double().cpu()
            ref = int8_reference(x.cpu(), W, fmt)
            err = float((y - ref).abs().max() / ref.abs().max())
            if err > 1e-2:
                bad += 1
                if bad <= 2:
                    print(f"  {fmt} {N}x{K} iter {it}: err {err:.2e}; y[:4] {y.flatten()[:4].tolist()} "
                          f"ref[:4] {ref.flatten()[:4].tolist()}")
        print(f"{fmt} {N}x{K}: {bad} of {args.iters} wrong")
