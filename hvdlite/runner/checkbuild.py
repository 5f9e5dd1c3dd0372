"""``hvdrun --check-build``: a table of what this installation can use.

hvdrun itself must not initialize MPI or import a framework, so every probe
runs in a child Python (in parallel, each with a time limit): one initializes
MPI through mpi4py (asking for MPI_THREAD_MULTIPLE) and reports the library,
the MPI standard version and the thread level it got; one per framework
imports it and reports its version and CUDA/NCCL support.  A probe that fails
shows as unavailable with its reason; the check itself always exits 0.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping

from ..version import __version__
from .errors import UsageError
from .mpi import detect, find_mpiexec

__all__ = ["check_build", "PROBES"]

_MPI_PROBE = r"""
import json
out = {}
try:
    import mpi4py
    out["mpi4py"] = mpi4py.__version__
    mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI
    out["library"] = " ".join(MPI.Get_library_version().split("\n")[0].split())
    out["standard"] = "%d.%d" % MPI.Get_version()
    levels = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
              MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED",
              MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE"}
    out["thread_level"] = levels.get(MPI.Query_thread(), str(MPI.Query_thread()))
    try:
        from hvdlite.device.capabilities import cuda_aware_mpi
        out["cuda_aware"], out["cuda_aware_reason"] = cuda_aware_mpi()
    except Exception as exc:
        out["cuda_aware_reason"] = "not asked: %s" % exc
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""

_TORCH_PROBE = r"""
import json
out = {}
try:
    import torch
    out["version"] = torch.__version__
    out["cuda"] = torch.version.cuda or ""
    out["cuda_available"] = bool(torch.cuda.is_available())
    if out["cuda_available"]:
        try:
            out["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:
            pass
except ImportError as exc:
    out["missing"] = str(exc)
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""

_TF_PROBE = r"""
import json, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
out = {}
try:
    import tensorflow as tf
    out["version"] = tf.__version__
    out["cuda"] = "yes" if tf.test.is_built_with_cuda() else ""
    out["cuda_available"] = bool(tf.config.list_physical_devices("GPU"))
    try:
        import keras
        out["keras"] = keras.__version__
    except ImportError:
        pass
except ImportError as exc:
    out["missing"] = str(exc)
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""

_CUPY_PROBE = r"""
import json
out = {}
try:
    import cupy
    out["version"] = cupy.__version__
    out["cuda"] = str(cupy.cuda.runtime.runtimeGetVersion())
    out["cuda_available"] = cupy.cuda.runtime.getDeviceCount() > 0
    from cupy.cuda import nccl
    if getattr(nccl, "available", True) and out["cuda_available"]:
        out["nccl"] = str(nccl.get_version())
except ImportError as exc:
    out["missing"] = str(exc)
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""

PROBES = {"mpi": _MPI_PROBE, "torch": _TORCH_PROBE, "tensorflow": _TF_PROBE, "cupy": _CUPY_PROBE}
_LAUNCHER_VARS = ("PMI_", "PMIX_", "OMPI_COMM_WORLD", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


def _probe_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment without a launcher's rank variables (the probe is a singleton)."""
    return {k: v for k, v in environ.items() if not k.startswith(_LAUNCHER_VARS)}


def _run_probes(environ: Mapping[str, str], timeout: float) -> dict[str, dict]:
    env = _probe_env(environ)
    procs = {}
    for name, code in PROBES.items():
        if name == "cupy" and importlib.util.find_spec("cupy") is None:
            continue  # do not start a child just to fail an import
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            start_new_session=True,
        )
    results = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=timeout)
            last = out.strip().splitlines()[-1] if out.strip() else "{}"
            results[name] = json.loads(last)
            if proc.returncode and not results[name]:
                results[name] = {"error": (err.strip().splitlines() or ["crashed"])[-1]}
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            results[name] = {"error": f"probe timed out after {timeout:g} s"}
        except ValueError:
            results[name] = {"error": "probe printed no result"}
    results.setdefault("cupy", {"missing": "not installed"})
    return results


def _row(label: str, ok: bool, text: str) -> str:
    return f"  {label:<18} [{'X' if ok else ' '}] {text}"


def _adapter(name: str) -> str:
    """Whether hvdlite's adapter module *name* is installed, without importing it
    (importing ``hvdlite.tensorflow`` would import TensorFlow into hvdrun)."""
    parts = name.split(".")[1:]
    spec = importlib.util.find_spec("hvdlite")
    found = False
    for base in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(base, *parts)
        if os.path.isfile(os.path.join(path, "__init__.py")) or os.path.isfile(path + ".py"):
            found = True
    return f"{name}: {'yes' if found else 'no'}"


def _framework_row(label: str, result: dict, adapter: str) -> str:
    if "version" in result:
        return _row(label, True, f"{result['version']}  ({_adapter(adapter)})")
    return _row(label, False, "not installed" if "missing" in result else result.get("error", "?"))


def check_build(environ: Mapping[str, str] | None = None, timeout: float = 120.0) -> str:
    """The --check-build table (it starts probe processes; it never raises)."""
    env = os.environ if environ is None else environ
    results = _run_probes(env, timeout)
    lines = [
        f"hvdlite {__version__} (Python {platform.python_version()}, {sys.executable})",
        "",
        "MPI",
    ]
    try:
        path = find_mpiexec(env)
        info = detect(path) if path else None
        lines.append(
            _row(
                "launcher",
                info is not None,
                f"{info.label}  {info.path}" if info else "no mpiexec/mpirun found",
            )
        )
    except UsageError as exc:
        lines.append(_row("launcher", False, str(exc)))
    mpi = results["mpi"]
    if "library" in mpi:
        lines.append(
            _row(
                "library", True, f"{mpi['library']} (MPI {mpi['standard']}, mpi4py {mpi['mpi4py']})"
            )
        )
        lines.append(
            _row(
                "thread level",
                mpi["thread_level"] == "MPI_THREAD_MULTIPLE",
                f"{mpi['thread_level']} (asked for MPI_THREAD_MULTIPLE)",
            )
        )
    else:
        lines.append(_row("library", False, mpi.get("error", "mpi4py not usable")))
    srun = shutil.which("srun", path=env.get("PATH"))
    lines.append(_row("SLURM srun", srun is not None, srun or "not on PATH"))
    torch, tf, cupy = results["torch"], results["tensorflow"], results["cupy"]
    lines += [
        "",
        "Frameworks",
        _framework_row("PyTorch", torch, "hvdlite.torch"),
        _framework_row("TensorFlow", tf, "hvdlite.tensorflow"),
    ]
    if "keras" in tf:
        keras_adapter = _adapter("hvdlite.tensorflow.keras")
        lines.append(_row("Keras", True, f"{tf['keras']}  ({keras_adapter})"))
    cuda_sources = [
        f"{name} (CUDA {r['cuda']})"
        for name, r in (("PyTorch", torch), ("TensorFlow", tf), ("CuPy", cupy))
        if r.get("cuda")
    ]
    gpus = any(r.get("cuda_available") for r in (torch, tf, cupy))
    nccl = cupy.get("nccl") or torch.get("nccl")
    lines += [
        "",
        "GPU",
        _row("CUDA build", bool(cuda_sources), ", ".join(cuda_sources) or "none (CPU only)"),
        _row("CUDA device", gpus, "found" if gpus else "none visible"),
        _row(
            "NCCL",
            bool(cupy.get("nccl")),
            f"{nccl} via {'CuPy' if cupy.get('nccl') else 'PyTorch (hvdlite uses CuPy)'}"
            if nccl
            else "not available (hvdlite uses NCCL through CuPy)",
        ),
        _row(
            "CUDA-aware MPI", bool(mpi.get("cuda_aware")), mpi.get("cuda_aware_reason", "not asked")
        ),
        _gpu_transport_row(cupy, mpi, env),
    ]
    return "\n".join(lines) + "\n"


def _gpu_transport_row(cupy: dict, mpi: dict, environ: Mapping[str, str]) -> str:
    """Which transport a GPU tensor would take in a job started like this one
    (every rank assumed to be set up like this host)."""
    from ..device.selection import Capabilities, DeviceChoice, read_request

    usable = bool(cupy.get("cuda_available"))
    try:
        request = read_request(environ)
    except ValueError as exc:
        return _row("GPU tensors", False, str(exc))
    if not usable:
        why = "CuPy is not installed" if "missing" in cupy else "CuPy sees no CUDA device"
        return _row(
            "GPU tensors",
            False,
            f"cannot be moved: {why} (pip install hvdlite[cuda12] or hvdlite[cuda13])",
        )
    caps = Capabilities(True, bool(cupy.get("nccl")), bool(mpi.get("cuda_aware")))
    routes = DeviceChoice(caps, request).routes()
    return _row(
        "GPU tensors",
        True,
        f"would use {routes.describe()} (HVDLITE_GPU_OPERATIONS=NCCL|MPI chooses)",
    )
