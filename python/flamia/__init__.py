"""flamia: FP8 attention for training, with one scale per (token, head).

    import flamia
    out = flamia.attention(q, k, v, cu_seqlens, max_seqlen, causal=True, recipe="fp8")
    out = flamia.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=True)

The torch-facing names are imported lazily so that `import flamia` (and the library
binding in flamia._lib) work on a machine without PyTorch.
"""

from typing import Any

from ._lib import FlamiaError, RECIPES

__version__ = "0.1.0"

__all__ = [
    "FlamiaError",
    "RECIPES",
    "check_errors",
    "attention",
    "flash_attn_varlen_func",
    "library_version",
    "gpu_available",
    "__version__",
]

_LAZY = {"attention", "flash_attn_varlen_func"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import ops

        return getattr(ops, name)
    raise AttributeError(f"module 'flamia' has no attribute {name!r}")


def library_version() -> str:
    """Version/build string of the loaded libflamia.so (raises FlamiaError if not found)."""
    from . import _lib

    return _lib.get().version()


def gpu_available() -> bool:
    """True when libflamia.so loads, has GPU kernels and sees a supported (sm_90) device."""
    from . import _lib

    try:
        return _lib.get().gpu_available()
    except FlamiaError:
        return False


def check_errors(device: Any = None) -> None:
    """Raise FlamiaError if a GPU call recorded an invalid input on the device.

    Without FLAMIA_CHECK=1, a device cu_seqlens (or max_seqlen) that breaks its invariants, or
    a reused quantized buffer that does not match the call, is detected on the GPU without a
    host synchronisation: the call returns normally, its outputs are NaN, and the fault is
    recorded per device. This reads and clears that record (it synchronises the device, so
    call it every N steps rather than every step). device: a CUDA ordinal or torch.device;
    None checks every device flamia has run on.
    """
    from . import _lib

    index = -1
    if device is not None:
        index = device if isinstance(device, int) else getattr(device, "index", None)
        if index is None:
            raise FlamiaError(f"flamia.check_errors: device {device!r} has no CUDA index")
    _lib.get().check_errors(int(index))
