# Which argument errors of uqr::_dequant_cuda segfault on the lent H200 (bench/NOTES.md v12): each
# case of tests/test_cuda_dequant.py in its own process, printing its exception or return code.
import subprocess, sys
code = r'''
import sys, torch, torch_uqr
from torch_uqr.triton_kernels.testing import random_packed
op = torch.ops.uqr._dequant_cuda
N, K = 8, 512
w = random_packed("q4_0", N, K, 0, seed=1, device="cuda")
out = torch.empty(N, K, dtype=torch.bfloat16, device="cuda")
cases = [
    (w.cpu(), "q4_0", N, K, 0, out), (w.view(torch.int8), "q4_0", N, K, 0, out), (w[:, :-18], "q4_0", N, K, 0, out),
    (w, "q4_0", N, K + 16, 0, out), (w, "q4_0", 0, K, 0, out), (w, "q5_0", N, K, 0, out), (w, "q4_0", N, K, 64, out),
    (w, "mlx4", N, K, 48, out), (torch.empty(N, 2 * w.shape[1], dtype=torch.uint8, device="cuda")[:, ::2], "q4_0", N, K, 0, out),
    (w, "q4_0", N, K, 0, out.to(torch.int32)), (w, "q4_0", N, K, 0, out[:, :256]), (w, "q4_0", N, K, 0, out.t().contiguous().t()),
    (w, "q4_0", N, K, 0, out.cpu()),
    (w, "q4_0", N, K, 0, torch.empty(N * K + 1, dtype=torch.bfloat16, device="cuda")[1:].view(N, K))]
i = int(sys.argv[1])
try:
    op(*cases[i]); print(i, "NO ERROR")
except Exception as e:
    print(i, type(e).__name__, str(e).splitlines()[0][:100])
'''
for i in range(14):
    r = subprocess.run([sys.executable, "-c", code, str(i)], capture_output=True, text=True)
    print(i, "rc", r.returncode, r.stdout.strip()[-150:])
