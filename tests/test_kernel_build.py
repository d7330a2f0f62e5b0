"""kernels.cu builds for the GPU: with NVRTC (what CuPy uses at run time) and with nvcc.

Neither compiler needs a GPU, so these run wherever the toolchain is installed (`make
test` installs NVRTC through the `kernelcheck` extra); each skips with the reason where
its compiler is missing. NVRTC is the stricter of the two: it has no <cmath>, which is
how `INFINITY` once compiled under nvcc and failed under NVRTC.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from gated.engine.ops_kernels import KERNEL_NAMES, KERNEL_SOURCE, NVRTC_OPTIONS


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as e:  # noqa: BLE001 - any failure to load means "no NVRTC here"
        pytest.skip(f"NVRTC is not available ({type(e).__name__}: {e}); "
                    "pip install -e '.[kernelcheck]'")
    return nvrtc


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_with_nvrtc(arch):
    nvrtc = _nvrtc()
    prog = nvrtc.createProgram(KERNEL_SOURCE.read_text(), "kernels.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [*NVRTC_OPTIONS, f"--gpu-architecture={arch}"])
        except nvrtc.NVRTCError:
            pytest.fail(f"NVRTC rejected kernels.cu for {arch}:\n{nvrtc.getProgramLog(prog)}")
        cubin = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    missing = [k for k in KERNEL_NAMES if k.encode() not in cubin]
    assert not missing, f"kernels missing from the {arch} binary: {missing}"


def test_kernels_build_with_nvcc_without_spills():
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    done = subprocess.run([nvcc, "-arch=sm_90", "-cubin", "-o", "/dev/null", "-Xptxas", "-v",
                           *NVRTC_OPTIONS, str(KERNEL_SOURCE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = done.stdout + done.stderr
    assert set(re.findall(r"Compiling entry function '(\w+)'", report)) == set(KERNEL_NAMES)
    spills = re.findall(r"(\d+) bytes spill stores", report)
    assert spills and all(n == "0" for n in spills), report
