"""Shared set-up for the Python tests.

GPU test modules call flamia_testutil.require_gpu() at import, which skips the module cleanly when
torch, CUDA or a GPU-capable libflamia.so is missing (this is the normal case on CI machines
without a GPU). Set FLAMIA_REQUIRE_GPU=1 to turn those skips into failures on a GPU machine;
it also requires torch here, so that the CPU modules that need it (the specification through
the custom ops, q_start, the context-parallel plan, the transformers glue) cannot skip there.
"""

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# Run from the source tree when the package is not installed (PYTHONPATH=python also works).
if importlib.util.find_spec("flamia") is None:
    sys.path.insert(0, os.path.dirname(_HERE))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
if os.environ.get("FLAMIA_REQUIRE_GPU") == "1":
    import torch  # noqa: F401  (an ImportError here: torch missing where it is required)
