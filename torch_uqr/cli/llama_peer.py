"""llama.cpp as a measured peer of the CPU benchmark: its ``test-backend-ops`` binary times ggml's own
CPU matrix multiply (``MUL_MAT``, fp32 activations) at the benchmark's shapes, and its ``llama-bench``
binary a whole model's prefill and decode (``bench --model``, :func:`llama_bench_tok_s`).

``test-backend-ops perf`` times only its built-in shapes, but it also reads operators from a test
file (``--test-file``, one operator per line: op, result type, result shape, op params, sources with
type, shape and byte strides, a name). :func:`mul_mat_ms` writes one ``MUL_MAT`` line per (format, N,
K, M), runs the binary once and returns its microseconds per run as milliseconds. ggml's weights of
the GGUF formats are byte-identical to ours (``gguf_type`` in the format table), so the peer
multiplies the same kind of blocks. Like ``--hot`` in the benchmark, ``test-backend-ops`` reuses one
weight buffer, which stays in the last-level cache when it fits.

The op's number in ggml's ``enum ggml_op`` is read from the ``ggml.h`` of the source tree the binary
was built in (found from its path: ``<src>/build/bin/test-backend-ops``), or given explicitly.

Threads: stock ``test-backend-ops`` runs the CPU backend on ``hardware_concurrency / 2`` threads.
The child gets ``GGML_TEST_THREADS`` = torch's thread count in its environment, which a build whose
``ggml_backend_set_n_threads`` call reads that variable honours (docs/perf/cpu-zen2.md says how the
documented numbers were produced).
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import tempfile
from typing import Optional

from ..formats import table as fmt_table

GGML_TYPE_F32 = 0
_F32_BYTES = 4


def ggml_type_id(fmt: str) -> Optional[int]:
    """ggml's type number of our format's blocks (the GGUF tensor type), None if ggml has none."""
    name = fmt_table.spec(fmt).gguf_type
    if name is None:
        return None
    import gguf
    return int(gguf.GGMLQuantizationType[name])


def find_ggml_header(binary: str) -> Optional[str]:
    """``ggml/include/ggml.h`` of the llama.cpp tree a build-tree binary sits in, if found."""
    d = os.path.dirname(os.path.abspath(binary))
    for _ in range(4):
        cand = os.path.join(d, "ggml", "include", "ggml.h")
        if os.path.isfile(cand):
            return cand
        d = os.path.dirname(d)
    return None


def op_id_from_header(path: str, op: str = "GGML_OP_MUL_MAT") -> int:
    """The value of ``op`` in ``enum ggml_op`` of ggml.h (members are consecutive from 0)."""
    with open(path) as f:
        text = f.read()
    m = re.search(r"enum\s+ggml_op\s*\{(.*?)\}", text, re.S)
    if not m:
        raise ValueError(f"{path}: no 'enum ggml_op' found")
    body = re.sub(r"//[^\n]*|/\*.*?\*/", "", m.group(1), flags=re.S)
    names = [item.split("=")[0].strip() for item in body.split(",") if item.strip()]
    if op not in names:
        raise ValueError(f"{path}: {op} not in enum ggml_op")
    return names.index(op)


def _case_name(fmt: str, N: int, K: int, M: int) -> str:
    return f"uqr_{fmt}_{N}x{K}_m{M}"


def test_file_lines(cases: list[tuple[str, int, int, int]], op_id: int) -> list[str]:
    """One test-file line per (fmt, N, K, M): y[M, N] = x[M, K] @ W[N, K]^T in ggml's convention
    (src0 = W as ne [K, N], src1 = x as ne [K, M], result ne [N, M], all fp32 but W)."""
    lines = []
    for fmt, N, K, M in cases:
        t = ggml_type_id(fmt)
        spec = fmt_table.spec(fmt)
        bsize, belems = spec.block_bytes, spec.block
        row = K // belems * bsize
        w = f"{t} {K} {N} 1 1 {bsize} {row} {row * N} {row * N}"
        x = f"{GGML_TYPE_F32} {K} {M} 1 1 {_F32_BYTES} {_F32_BYTES * K} {_F32_BYTES * K * M} {_F32_BYTES * K * M}"
        lines.append(f"{op_id} {GGML_TYPE_F32} {N} {M} 1 1 0 2 {w} {x} {_case_name(fmt, N, K, M)}")
    return lines


def mul_mat_ms(binary: str, cases: list[tuple[str, int, int, int]], threads: int,
               op_id: Optional[int] = None, timeout_s: float = 1800.0) -> dict[tuple[str, int, int, int], float]:
    """Runs ``binary perf -b CPU --test-file ...`` over the cases ggml has a type for; returns
    {(fmt, N, K, M): ms per run}. Raises RuntimeError when the binary fails or prints no timing."""
    cases = [c for c in cases if ggml_type_id(c[0]) is not None]
    if not cases:
        return {}
    if op_id is None:
        header = find_ggml_header(binary)
        if header is None:
            raise RuntimeError(f"--llama-cpp-bin {binary}: cannot find ggml/include/ggml.h above it to read "
                               "GGML_OP_MUL_MAT's number; pass --ggml-mul-mat-op")
        op_id = op_id_from_header(header)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(test_file_lines(cases, op_id)) + "\n")
        path = f.name
    try:
        env = dict(os.environ, GGML_TEST_THREADS=str(threads))
        proc = subprocess.run([binary, "perf", "-b", "CPU", "--test-file", path], capture_output=True, text=True,
                              env=env, timeout=timeout_s)
    finally:
        os.unlink(path)
    found = {m.group(1): float(m.group(2)) / 1e3
             for m in re.finditer(r"name=(uqr_\w+).*?:\s+\d+ runs -\s+([\d.]+) us/run", proc.stdout)}
    out = {c: found[_case_name(*c)] for c in cases if _case_name(*c) in found}
    if not out:
        tail = (proc.stdout + proc.stderr)[-2000:]
        raise RuntimeError(f"--llama-cpp-bin {binary}: no MUL_MAT timings in its output (exit {proc.returncode}):\n{tail}")
    return out


def parse_llama_bench_json(text: str, pp: int, tg: int) -> dict[int, tuple[float, float]]:
    """{threads: (prefill tok/s, decode tok/s)} from ``llama-bench -o json`` output: for each thread
    count, the median of the per-repetition ``samples_ts`` (else ``avg_ts``) of its ``n_prompt = pp,
    n_gen = 0`` and ``n_prompt = 0, n_gen = tg`` tests. Raises ValueError when one is missing."""
    start = text.find("[")
    try:
        tests = json.loads(text[start:] if start >= 0 else text)
    except json.JSONDecodeError as e:
        raise ValueError(f"llama-bench: its output is not JSON ({e}): {text[:500]!r}") from None
    found: dict[tuple[int, str], float] = {}
    for t in tests:
        kind = ("pp" if (t.get("n_prompt"), t.get("n_gen")) == (pp, 0)
                else "tg" if (t.get("n_prompt"), t.get("n_gen")) == (0, tg) else None)
        if kind is not None:
            ts = t.get("samples_ts") or [t["avg_ts"]]
            found[(int(t["n_threads"]), kind)] = statistics.median(float(v) for v in ts)
    out = {n: (found[(n, "pp")], found[(n, "tg")]) for n, _ in found if (n, "pp") in found and (n, "tg") in found}
    if not out:
        raise ValueError(f"llama-bench: no pp{pp} and tg{tg} results for one thread count in its JSON output")
    return out


def llama_bench_tok_s(binary: str, model: str, pp: int, tg: int, threads: list[int], reps: int,
                      timeout_s: float = 3600.0) -> dict[int, tuple[float, float]]:
    """Runs ``binary -m model -p pp -n tg -t threads -r reps -o json`` once over all thread counts;
    returns {threads: (prefill tok/s, decode tok/s)} (medians over its repetitions). Raises
    RuntimeError when the binary fails, ValueError when a thread count has no result."""
    cmd = [binary, "-m", model, "-p", str(pp), "-n", str(tg), "-t", ",".join(map(str, threads)),
           "-r", str(reps), "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"--llama-bench: {' '.join(cmd)} failed (exit {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-2000:]}")
    out = parse_llama_bench_json(proc.stdout, pp, tg)
    missing = [n for n in threads if n not in out]
    if missing:
        raise ValueError(f"--llama-bench: no pp{pp}/tg{tg} result at {missing} threads in its output")
    return out
