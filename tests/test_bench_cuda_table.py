"""The CUDA benchmark's markdown table (torch_uqr/cli/bench_cuda.table) from hand-made rows (no GPU)."""
from torch_uqr.cli.bench_cuda import FORMATS, table


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


def test_table_int8_rides_along_and_is_never_best():
    from torch_uqr.cli.bench_cuda import INT8_NOTE
    rows = [_row("bf16", "cublas", 1, 0.013), _row("q4_0", "qmma", 1, 0.0085),
            _row("q4_0", "int8", 1, 0.0061, max_rel_err=4e-3), _row("q4_k", "int8", 1, 0.007),
            _row("ternary", "gemv", 1, 0.009), _row("ternary", "vec", 1, 0.012)]
    lines = table(rows).splitlines()
    cells = lines[2].split(" | ")
    assert cells[4 + FORMATS.index("q4_0")] == "8.5 (q) / int8 6.1", "the faster int8 is not the best kernel"
    assert cells[4 + FORMATS.index("q4_k")] == "- / int8 7.0"
    assert cells[4 + FORMATS.index("ternary")].rstrip(" |") == "9.0 (g) / vec 12.0"
    assert lines[-1] == INT8_NOTE and INT8_NOTE not in table(rows[:2])
