"""Loads one of mamba-ssm's Triton modules without the package's `__init__` (which needs CUDA
extensions not built on the GPU machine), shared by `mamba_step.py` and `mamba_ssd.py`, which
import it from their own folder. `TESSERA_MAMBA_SRC` names an unpacked mamba-ssm source tree,
`TESSERA_PYLIB` a folder with einops (default `mamba_src` and `pylib` beside this file:
`scripts/fetch-baselines.sh` fetches both)."""
import importlib
import os
import sys
import types

here = os.path.dirname(os.path.abspath(__file__))


def load(module):
    """`mamba_ssm.<module>`, e.g. `load("ops.triton.ssd_combined")`."""
    sys.path.insert(0, os.environ.get("TESSERA_PYLIB", os.path.join(here, "pylib")))
    root = os.environ.get("TESSERA_MAMBA_SRC", os.path.join(here, "mamba_src"))
    pkg = types.ModuleType("mamba_ssm")
    pkg.__path__ = [os.path.join(root, "mamba_ssm")]
    sys.modules["mamba_ssm"] = pkg
    return importlib.import_module(f"mamba_ssm.{module}")
