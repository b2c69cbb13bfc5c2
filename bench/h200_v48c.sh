#!/usr/bin/env bash
# v48c on the lent H200: v48's one failing test passed when rerun alone (v48b), so it is run 8 times
# here with its message kept (fresh random weights and x every run), plus the int8 suite once more.
# The ternary int8 code these ran is in no commit (NOTES v48).
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  for i in 1 2 3 4 5 6 7 8; do
    python3 -m pytest -q -x tests/test_cuda_int8.py -k "one_row" 2>&1 > "$OUT/t$i.txt"
    tail -1 "$OUT/t$i.txt"
    grep -q failed "$OUT/t$i.txt" && grep -E "^E |Error" "$OUT/t$i.txt" | head -20
  done
  python3 -m pytest -q -n 8 tests/test_cuda_int8.py 2>&1 | tail -2
  date -u
} 2>&1 | tee "$OUT/run.log"
