# lit configuration for mt: IR tests (.mlir), spec tests (.toml), CLI tests
# (.test) and the GoogleTest binary in unit/.
import os
import sys

import lit
import lit.formats

config.name = "mt"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".toml", ".test"]
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.mt_obj_root, "test")

config.environment["FILECHECK_OPTS"] = "--enable-var-scope"
# Deterministic, uncoloured tool output.
config.environment["LC_ALL"] = "C"
for var in ["MT_SHARED_DATA", "PYTHONPATH", "LD_LIBRARY_PATH"]:
    if var in os.environ:
        config.environment[var] = os.environ[var]

path = os.pathsep.join([config.mt_tools_dir, config.llvm_tools_dir,
                        config.environment.get("PATH", os.environ["PATH"])])
config.environment["PATH"] = path

# %python: the python that compatibility tests run, and the reference
# packages it imports (test/reference-packages.txt) as lit features.
# It is the first of: $MT_PYTHON; build/reference-venv, where
# `./setup.sh test --full` installs the pinned packages; PATH's python3 or
# Debian's, whichever has numpy (setup.sh installs python3-numpy).
import shutil
import subprocess

sys.path.insert(0, os.path.dirname(__file__))
import reference_packages  # noqa: E402

def _has_numpy(exe):
    return exe and subprocess.call([exe, "-c", "import numpy"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL) == 0

_venv = os.path.join(config.mt_obj_root, "reference-venv", "bin", "python")
if os.environ.get("MT_PYTHON"):
    _python3 = os.environ["MT_PYTHON"]
elif os.path.exists(_venv):
    _python3 = _venv
else:
    _candidates = [shutil.which("python3", path=path), "/usr/bin/python3"]
    _python3 = next((c for c in _candidates if c and os.path.exists(c) and _has_numpy(c)),
                    _candidates[0] or "python3")
_found = [f for f, why in reference_packages.probe(_python3).items() if why is None]
config.available_features.update(_found)
lit_config.note(f"%python is {_python3}; reference packages it imports: {', '.join(_found) or 'none'}")

config.substitutions.append(("%python", _python3))
# lit itself, for the test of test/run_tests.py (test/harness).
config.substitutions.append(("%mt_lit", os.path.join(os.path.dirname(os.path.dirname(lit.__file__)), "lit.py")))
# test/slurm runs its tests one at a time (see its lit.local.cfg).
lit_config.parallelism_groups["slurm"] = 1
config.substitutions.append(("%mt_src_root", config.mt_src_root))
config.substitutions.append(("%mt_obj_root", config.mt_obj_root))

# GPT-2's real vocabulary lives beside the checkout on development machines.
shared = os.path.join(config.mt_src_root, "..", "shared", "data", "gpt2")
if os.path.isfile(os.path.join(shared, "vocab.json")):
    config.available_features.add("gpt2-data")
    config.substitutions.append(("%gpt2_data", shared))

# MT_TEST_HOOKS (CMake option, on by default): the environment variables
# that put a rank in a known state (MT_TEST_STALL_AT_COLLECTIVE) work.
if getattr(config, "mt_test_hooks", "") in ("ON", "1", "TRUE", "YES", "on", "true"):
    config.available_features.add("test-hooks")

# srun tests start a private one-node SLURM (test/slurm/start-slurm.sh),
# which needs root and the SLURM and munge daemons installed (the script
# installs them with apt-get when run by hand). Only a look at PATH here.
_sbin = os.pathsep.join([path, "/usr/sbin", "/sbin"])
if hasattr(os, "geteuid") and os.geteuid() == 0 and all(
        shutil.which(t, path=_sbin) for t in ["slurmd", "slurmctld", "srun", "sinfo", "munged"]):
    config.available_features.add("slurm")

# CUDA (docs/architecture.md, "CUDA at run time"). `cuda-driver`: this
# machine has a loadable libcuda.so.1, so `mtrun --device cuda` gets past
# the driver. `cuda-stub`: the toolkit's stub libcuda.so, which lets a test
# put a driver that has no GPU behind it in mtrun's way.
if subprocess.call([sys.executable, "-c", "import ctypes; ctypes.CDLL('libcuda.so.1')"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0:
    config.available_features.add("cuda-driver")
    # `cuda-2gpus`: two GPUs or more, for NCCL between ranks (NCCL puts one
    # rank of a communicator on each GPU).
    try:
        _gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        if _gpus.returncode == 0 and _gpus.stdout.count("GPU ") >= 2:
            config.available_features.add("cuda-2gpus")
    except (OSError, subprocess.SubprocessError):
        pass
for _home in [os.environ.get("MT_CUDA_HOME"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"]:
    if _home and os.path.isfile(os.path.join(_home, "lib64", "stubs", "libcuda.so")):
        config.available_features.add("cuda-stub")
        config.substitutions.append(("%cuda_stub", os.path.join(_home, "lib64", "stubs", "libcuda.so")))
        break
# NVRTC (the CUDA toolkit's runtime compiler; no GPU needed) for the tests of
# `mtc compile --check-kernels`. Searched as runtime/exec/cuda/cuda_api.cpp searches.
import ctypes

def _find_nvrtc():
    forced = os.environ.get("MT_NVRTC_LIBRARY")
    names = ["libnvrtc.so.13", "libnvrtc.so.12"]
    dirs = [os.environ.get(v) for v in ["MT_CUDA_HOME", "CUDA_HOME"]] + ["/usr/local/cuda"]
    paths = [forced] if forced else names + [os.path.join(d, "lib64", n)
                                              for d in dirs if d for n in names]
    for p in paths:
        try:
            ctypes.CDLL(p)
            return True
        except OSError:
            pass
    return False

for var in ["MT_NVRTC_LIBRARY", "MT_CUDA_HOME", "CUDA_HOME"]:
    if var in os.environ:
        config.environment[var] = os.environ[var]
if _find_nvrtc():
    config.available_features.add("nvrtc")
