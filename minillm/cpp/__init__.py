"""C++ kernels for the CPU, compiled once per machine and loaded with ctypes.

The engine's CPU kernels (layers/cpu_ops.cpp, kernels/paged_decode_cpu.cpp, quant/fused_matvec.cpp) are
small C++ files built with the system's compiler (g++ -O3 -march=native -fopenmp) the first time they are
used, and cached under ~/.cache/minillm/kernels, keyed by the source, the headers of this folder they may
include (vec.h: eight and sixteen floats as one value), the flags and the CPU's feature flags (-march=native ties a
binary to its CPU). Without a compiler, or when a build fails (a warning says why), `load` returns None and
the caller keeps its plain-PyTorch path. The engine's lowest layer: the layers themselves use it.
"""
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
HEADERS = Path(__file__).parent  # `#include "vec.h"` finds the shared headers here (-I)


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "minillm" / "kernels"


# the C types of the kernels' arguments: pointers to tensor data, sizes and strides, thread counts, scalars
PTR, I64, INT, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


def load(source: Path, what: str, signatures: dict[str, list], flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The library compiled from `source` (built now if this machine has none yet), its functions' argument types
    set from signatures (name -> C types), or None where there is no compiler or the build fails; what: the
    kernels in words, for the warning; flags: compiler flags after the usual ones (the tests build for an older
    instruction set with `("-march=haswell", "-mno-avx512f")`, say). Callers cache the result."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None or not source.is_file():
        return None
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    flags_line = next((line for line in cpu.splitlines() if line.startswith("flags")), "")
    headers = b"".join(h.read_bytes() for h in sorted(HEADERS.glob("*.h")))
    key = hashlib.sha256(source.read_bytes() + headers + " ".join(FLAGS + flags).encode() + flags_line.encode())
    key = key.hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            done = subprocess.run([compiler, *FLAGS, *flags, f"-I{HEADERS}", str(source), "-o", str(built)],
                                  capture_output=True)
            if done.returncode != 0:
                warnings.warn(f"minillm: building {what} with {compiler} failed, so the plain-PyTorch path runs "
                              f"instead:\n{done.stderr.decode()[-2000:]}", stacklevel=3)
                return None
            built.replace(target)  # atomic: another process building at the same time sees a whole file
    # Loaded after torch: libgomp.so.1 resolves to torch's, so the kernels share its threads.
    lib = ctypes.CDLL(str(target))
    for name, argtypes in signatures.items():
        getattr(lib, name).argtypes = argtypes
    return lib
