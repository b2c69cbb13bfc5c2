"""Which argument errors of the extension's ops segfault instead of raising (bench/NOTES.md v12/v13):
each case in its own process, printing the exception or the return code."""
import subprocess
import sys

CASES = {
    "dequant_cuda int msg (mlx4 group_size 48)": "torch.ops.uqr._dequant_cuda(w, 'mlx4', N, K, 48, out)",
    "dequant_cuda string msg (fmt q5_0)": "torch.ops.uqr._dequant_cuda(w, 'q5_0', N, K, 0, out)",
    "gemm on CPU int msg (K=500)": "torch.ops.uqr.gemm(x.cpu(), w.cpu(), 'q4_0', N, 500, 0, 0, False, 'auto')",
    "gemm on CUDA int msg (K=500)": "torch.ops.uqr.gemm(x, w, 'q4_0', N, 500, 0, 0, False, 'auto')",
    "qmma_cuda int msg (K=500)": "torch.ops.uqr._qmma_cuda(x, w, 'q4_0', N, 500, 0, 0, False)",
    "torch itself int msg (view)": "torch.empty(6, device='cuda').view(4)",
}
PRELUDE = r'''
import torch, torch_uqr
from torch_uqr.triton_kernels.testing import random_packed
N, K = 8, 512
w = random_packed("q4_0", N, K, 0, seed=1, device="cuda")
x = torch.randn(2, K, device="cuda", dtype=torch.bfloat16)
out = torch.empty(N, K, dtype=torch.bfloat16, device="cuda")
try:
    {stmt}; print("NO ERROR")
except Exception as e:
    print(type(e).__name__, str(e).splitlines()[0][:110])
'''
for name, stmt in CASES.items():
    r = subprocess.run([sys.executable, "-c", PRELUDE.format(stmt=stmt)], capture_output=True, text=True)
    print(f"{name:45s} rc {r.returncode:4d} {r.stdout.strip()[-130:]} {r.stderr.strip()[-200:] if r.returncode else ''}",
          flush=True)
