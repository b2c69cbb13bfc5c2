#!/usr/bin/env bash
# v13a on the lent H200: (1) the integer-message segfault (NOTES v12): toolchain facts, and the error
# probe on the default build with the stream-free check messages (uqr/check.h); (2) where the scratch path's time
# goes at large M (bench/largem_probe.py) with the SM clock and power sampled alongside; (3) the
# scratch path split over N and pipelined over two streams (bench/pipeline_probe.py).
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  echo "== toolchain"
  which -a g++ c++ gcc cc; ls /usr/bin/g++* /usr/bin/gcc* 2>&1 | tr '\n' ' '; echo
  for c in $(which -a g++) /usr/bin/g++; do [ -x "$c" ] && echo "$c: $($c --version | head -1)"; done
  echo "CXX=${CXX:-unset} CC=${CC:-unset}"
  python3 - <<'PY'
import torch, re
print("torch", torch.__version__, "cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI)
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if re.search(r"libstdc\+\+|libgcc_s", l)})
print("loaded:", libs)
for p in libs:
    if "stdc++" in p:
        data = open(p, "rb").read()
        print(p, "newest GLIBCXX:", sorted(set(re.findall(rb"GLIBCXX_3\.4\.\d+", data)), key=lambda s: int(s.split(b".")[-1]))[-1])
PY
  h200_build || exit 1
  grep -m2 -oE "^[^ ]*(g\+\+|c\+\+)[^ ]* " "$OUT/build.log" | sort -u
  so=$(ls torch_uqr/_C*.so | head -1); ldd "$so" | grep -E "stdc|gcc_s"
  echo "== error probe (default build; messages built by UQR_CHECK, csrc/include/uqr/check.h)"
  timeout 120 python3 bench/error_path_probe.py
  timeout 120 python3 -m pytest -q tests/test_cuda_dequant.py -k errors 2>&1 | tail -2
  echo "== pipelined scratch path GPU tests"
  timeout 120 python3 -m pytest -q -x tests/test_cuda_scratch_pipeline.py 2>&1 | tail -3
  echo "== large-M probe (SM clock / power sampled every 100 ms into smi.csv)"
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 > "$OUT/smi.csv" &
  smi=$!
  export PYTHONPATH=.  # the probes import torch_uqr from the checkout (the first call lacked this)
  timeout 150 python3 bench/largem_probe.py --json "$OUT/largem.json"
  echo "== pipelined scratch path (slices x ring buffers; 1x1 = plain)"
  timeout 240 python3 bench/pipeline_probe.py --json "$OUT/pipeline.json"
  kill $smi
  python3 - "$OUT/smi.csv" <<'PY'
import sys
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(",") == 3]
clk = [int(r[1].split()[0]) for r in rows]; pw = [float(r[2].split()[0]) for r in rows if r[2][0].isdigit()]
busy = [c for c in clk if c > 1000]
print(f"smi samples {len(clk)}: SM clock busy min/median/max {min(busy)}/{sorted(busy)[len(busy)//2]}/{max(busy)} MHz;"
      f" power max {max(pw):.0f} W")
PY
  date -u
} 2>&1 | tee "$OUT/run.log"
