"""Build torch_uqr._C: the uqr operator library (CPU kernels everywhere, Metal glue on macOS).

When torch is a CUDA build and nvcc is found, the extension also compiles the CUDA C++ kernels
(csrc/cuda/, sm_80 and sm_90a) and defines UQR_WITH_CUDA; the CPU-only build is unchanged.
Set UQR_NATIVE=0 to build without -march=native (a portable binary), UQR_CUDA=0 to leave the
CUDA kernels out.

The C++ standard follows the installed torch: its headers stop below C++20 from torch 2.14 on, and
an explicit ``-std=`` here also disables torch's own default, so the choice is made from the
headers themselves (``cxx_standard``) and given to the host compiler and nvcc alike.
"""
import glob
import os
import re
import sys

from setuptools import find_packages, setup
import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def cpu_sources():
    return sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp"))


SUPPORTED_TORCH = ">=2.4"


def cxx_standard(include_dirs=None) -> str:
    """``"c++20"`` when the torch headers in ``include_dirs`` (default: the installed torch's)
    require it, else ``"c++17"`` (the lowest standard every supported torch accepts).

    Read from ``ATen/ATen.h`` rather than from the version number, so a backport or a future
    release that raises the bar is followed without an edit here."""
    if include_dirs is None:
        from torch.utils.cpp_extension import include_paths
        include_dirs = include_paths()
    for d in include_dirs:
        header = os.path.join(d, "ATen", "ATen.h")
        if os.path.exists(header):
            with open(header, encoding="utf-8", errors="replace") as f:
                text = f.read()
            return "c++20" if re.search(r"__cplusplus\s*<\s*202002L", text) else "c++17"
    raise RuntimeError(f"torch headers not found (no ATen/ATen.h under {include_dirs})")


def extra_compile_args(std=None):
    args = ["-O3", f"-std={std or cxx_standard()}", "-fvisibility=hidden"]
    if os.environ.get("UQR_NATIVE", "1") != "0" and sys.platform != "darwin":
        args.append("-march=native")
    args += openmp_args()
    return args


def openmp_args():
    """at::parallel_for is an inline template that expands to `#pragma omp parallel` in our own
    objects when torch's parallel backend is OpenMP: without -fopenmp it silently runs on one
    thread (measured: 1 and 2 threads gave the same time before this flag)."""
    if sys.platform != "darwin" and torch._C.has_openmp:
        return ["-fopenmp"]
    return []


def generate_shader_header():
    """Embed the Metal library source (shaders/ + csrc/include/uqr/, includes inlined) as
    csrc/mps/uqr_shader_source.h for the MPS glue, which compiles it at first use. The generator is
    torch_uqr/backends/metal/source.py, loaded by path so the package need not be importable yet."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "_uqr_shader_source", os.path.join(ROOT, "torch_uqr", "backends", "metal", "source.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_embedded_header(os.path.join(ROOT, "csrc", "mps", "uqr_shader_source.h"))


def cuda_build() -> bool:
    """Compile the CUDA C++ kernels: torch built with CUDA and an nvcc to compile them with
    (UQR_CUDA=0 leaves them out, e.g. for a CPU-only build against a CUDA wheel of torch)."""
    return os.environ.get("UQR_CUDA", "1") != "0" and bool(torch.version.cuda) and CUDA_HOME is not None and \
        os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc"))


# Exact decode: no --use_fast_math (it would flush subnormal scales and relax the dot's rounding).
# UQR_CUDA_ARCHS (e.g. "90a") narrows the targets for a quicker build on one known GPU.
CUDA_ARCHS = os.environ.get("UQR_CUDA_ARCHS", "80,90a").split(",")


def nvcc_args(std=None):
    return ["-O3", f"-std={std or cxx_standard()}", "--threads", "2"] + [
        a for arch in CUDA_ARCHS for a in ("-gencode", f"arch=compute_{arch},code=sm_{arch}")]


def extensions():
    sources = cpu_sources()
    cxx = extra_compile_args()
    define_macros = []
    if sys.platform == "darwin" and os.uname().machine == "arm64":
        generate_shader_header()
        sources += sorted(glob.glob("csrc/mps/*.mm"))
        define_macros.append(("UQR_WITH_MPS", "1"))
        cxx = cxx + ["-fobjc-arc"]
    extension, compile_args = CppExtension, {"cxx": cxx}
    if cuda_build():
        sources += sorted(glob.glob("csrc/cuda/*.cu") + glob.glob("csrc/cuda/*.cpp"))
        define_macros.append(("UQR_WITH_CUDA", "1"))
        extension, compile_args = CUDAExtension, {"cxx": cxx, "nvcc": nvcc_args()}
    return [
        extension(
            "torch_uqr._C",
            sources,
            include_dirs=[os.path.join(ROOT, "csrc", "include")],
            define_macros=define_macros,
            extra_compile_args=compile_args,
            extra_link_args=(["-framework", "Metal", "-framework", "Foundation"]
                             if sys.platform == "darwin" else openmp_args()),
        )
    ]


def main() -> None:
    setup(
        name="torch_uqr",
        version="0.1.0",
        description="Universal Quantization Router: one PyTorch GEMM operator for GGUF, MLX, "
                    "EXL2/3-style and BitNet weights",
        packages=find_packages(include=["torch_uqr", "torch_uqr.*"]),
        package_data={"torch_uqr": ["data/*", "backends/metal/*"]},
        python_requires=">=3.10",
        install_requires=[f"torch{SUPPORTED_TORCH}", "numpy", "tqdm"],
        ext_modules=extensions(),
        cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    )


# setuptools runs this file as __main__ (PEP 517 and `python setup.py` alike); the build test
# imports it under another name to read the compile flags without building.
if __name__ == "__main__":
    main()
