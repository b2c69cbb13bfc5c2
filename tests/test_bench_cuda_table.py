"""The CUDA benchmark's markdown table (torch_uqr/bench_cuda.table) from hand-made rows (no GPU)."""
from torch_uqr.bench_cuda import FORMATS, table


def _row(fmt, kernel, M, ms, **kw):
    return dict({"N": 4096, "K": 4096, "M": M, "fmt": fmt, "kernel": kernel, "ms": ms}, **kw)


def test_table_best_kernel_and_paired_ratios():
    rows = [_row("bf16", "cublas", 4096, 0.2), _row("int4_g32", "tinygemm", 4096, 4.0),
            _row("q4_0", "fused", 4096, 0.5), _row("q4_0", "scratch", 4096, 0.21),
            _row("q4_0", "auto_eager", 4096, 0.1),  # eager rows never count as a kernel
            _row("q4_0", "auto_paired", 4096, 0.22, cublas_ms=0.198, ratio_vs_cublas=0.9),
            _row("q8_0", "scratch", 4096, 0.25)]
    md = table(rows).splitlines()
    assert md[0].startswith("| N x K | M | cuBLAS bf16 us | tinygemm g32 us | q4_0")
    main = md[2].split(" | ")
    assert main[2] == "200.0 (c)" and main[3] == "4000.0 (t)"
    assert main[4] == "210.0 (s)"  # the faster of fused / scratch
    assert main[4 + FORMATS.index("q8_0")] == "250.0 (s)"
    paired = [l for l in md if l.startswith("| 4096x4096 | 4096 |")][-1].split(" | ")
    assert paired[2] == "0.90" and paired[2 + FORMATS.index("q8_0")] == "-"


def test_table_without_paired_rows_has_one_table():
    md = table([_row("bf16", "cublas", 1, 0.013), _row("q4_0", "qmma", 1, 0.0085)])
    assert "interleaved" not in md and md.count("\n") == 2
