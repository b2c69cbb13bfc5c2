"""Build torch_uqr._C: the uqr operator library (CPU kernels everywhere, Metal glue on macOS).

Most CUDA kernels are Triton (JIT at first call). When torch is a CUDA build and nvcc is found,
the extension also compiles the small-M CUDA C++ kernel (csrc/cuda/, sm_80 and sm_90a) and defines
UQR_WITH_CUDA; the CPU-only build is unchanged.
Set UQR_NATIVE=0 to build without -march=native (a portable binary).
"""
import glob
import os
import sys

from setuptools import find_packages, setup
import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def cpu_sources():
    return sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp"))


def extra_compile_args():
    args = ["-O3", "-std=c++17", "-fvisibility=hidden"]
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
    torch_uqr/metal_emu/source.py, loaded by path so the package need not be importable yet."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "_uqr_shader_source", os.path.join(ROOT, "torch_uqr", "metal_emu", "source.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_embedded_header(os.path.join(ROOT, "csrc", "mps", "uqr_shader_source.h"))


def cuda_build() -> bool:
    """Compile the CUDA C++ kernels: torch built with CUDA and an nvcc to compile them with."""
    return bool(torch.version.cuda) and CUDA_HOME is not None and \
        os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc"))


# Exact decode: no --use_fast_math (it would flush subnormal scales and relax the dot's rounding).
# UQR_CUDA_ARCHS (e.g. "90a") narrows the targets for a quicker build on one known GPU.
CUDA_ARCHS = os.environ.get("UQR_CUDA_ARCHS", "80,90a").split(",")
NVCC_ARGS = ["-O3", "-std=c++17", "--threads", "2"] + [
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
        extension, compile_args = CUDAExtension, {"cxx": cxx, "nvcc": NVCC_ARGS}
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


setup(
    name="torch_uqr",
    version="0.1.0",
    description="Universal Quantization Router: one PyTorch GEMM operator for GGUF, MLX, EXL2/3-style and BitNet weights",
    packages=find_packages(include=["torch_uqr", "torch_uqr.*"]),
    package_data={"torch_uqr": ["data/*", "metal_emu/*"]},
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "numpy", "tqdm"],
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
