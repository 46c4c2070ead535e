"""ctypes binding of the flamia C ABI (include/flamia/flamia.h).

Nothing here imports torch: the binding describes tensors by raw views (pointer, dtype,
shape, strides, device), so it can be loaded and inspected on a machine without PyTorch.
The torch-facing code lives in ops.py.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from pathlib import Path
from typing import List, Optional, Sequence

__all__ = [
    "FlamiaError",
    "QUERY_TILE",
    "Tensor",
    "AttentionArgs",
    "Library",
    "get",
    "library_path",
    "candidate_paths",
    "DTYPE_BF16",
    "DTYPE_FP32",
    "DTYPE_INT32",
    "DTYPE_UINT8",
    "RECIPES",
    "recipe_id",
    "available",
]


class FlamiaError(RuntimeError):
    """An error reported by the flamia library (its message names the bad argument) or by
    the Python layer for problems the library cannot see."""


# ---- constants mirrored from flamia.h ------------------------------------------------------
MAX_DIMS = 4
DEVICE_HOST = -1
QUERY_TILE = 128  # FLAMIA_QUERY_TILE: q_start values are multiples of it

SUCCESS = 0
STATUS_NAMES = {
    0: "SUCCESS",
    1: "INVALID_ARGUMENT",
    2: "UNSUPPORTED",
    3: "CUDA",
    4: "NONFINITE",
}

DTYPE_BF16 = 0
DTYPE_FP32 = 1
DTYPE_INT32 = 2
DTYPE_UINT8 = 3

RECIPES = {"fp8": 0, "fp8_mixed": 1}

# flamia_dq_path (flamia.h): how the device backward forms dQ.
DQ_RECOMPUTE, DQ_STORED, DQ_STORED_REQUIRED, DQ_FUSED = 0, 1, 2, 3


def recipe_id(recipe: str) -> int:
    try:
        return RECIPES[recipe]
    except KeyError:
        raise FlamiaError(
            f"flamia: recipe must be one of {sorted(RECIPES)}, got {recipe!r}"
        ) from None


class Tensor(ctypes.Structure):
    """struct flamia_tensor."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),  # C enum: int-sized on every ABI we target
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
        ("device", ctypes.c_int32),
    ]

    @classmethod
    def make(
        cls,
        data: int,
        dtype: int,
        shape: Sequence[int],
        strides: Sequence[int],
        device: int,
    ) -> "Tensor":
        if len(shape) > MAX_DIMS:
            raise FlamiaError(f"flamia: tensor has {len(shape)} dims; at most {MAX_DIMS} are supported")
        t = cls()
        t.data = data or None
        t.dtype = dtype
        t.ndim = len(shape)
        for i, (n, s) in enumerate(zip(shape, strides)):
            t.shape[i] = int(n)
            t.strides[i] = int(s)
        t.device = device
        return t


class AttentionArgs(ctypes.Structure):
    """struct flamia_attention_args."""

    _fields_ = [
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("cu_seqlens", Tensor),
        ("max_seqlen", ctypes.c_int32),
        ("causal", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("recipe", ctypes.c_int),
        ("stream", ctypes.c_void_p),
        # Optional [B] int32: document b's first query row (data NULL: absent, all rows).
        ("q_start", Tensor),
    ]


# ---- locating the shared library ------------------------------------------------------------
_LIB_NAME = "libflamia.so"
_PKG_DIR = Path(__file__).resolve().parent
# python/flamia/_lib.py -> repository root (when running from the source tree).
_REPO_ROOT = _PKG_DIR.parent.parent


def candidate_paths() -> List[Path]:
    """Where the library is looked for, in order: $FLAMIA_LIBRARY, the copy shipped inside
    the installed package, then ./build*/libflamia.so under the source tree and the current
    directory (newest first, so a fresh rebuild wins over a stale build folder)."""
    env = os.environ.get("FLAMIA_LIBRARY")
    if env:
        # An explicit choice is never silently replaced by another copy.
        return [Path(env)]
    out: List[Path] = [_PKG_DIR / _LIB_NAME]
    seen = set()
    builds: List[Path] = []
    for root in (_REPO_ROOT, Path.cwd()):
        for p in glob.glob(str(root / "build*" / _LIB_NAME)):
            rp = Path(p).resolve()
            if rp not in seen:
                seen.add(rp)
                builds.append(rp)
    builds.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return out + builds


def library_path() -> Optional[Path]:
    for p in candidate_paths():
        if p.is_file():
            return p
    return None


class Library:
    """The loaded libflamia.so with typed entry points."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._dll = ctypes.CDLL(str(path))
        except OSError as e:
            raise FlamiaError(f"flamia: cannot load {path}: {e}") from e
        try:
            self._bind()
        except AttributeError as e:
            # A library built from a tree whose C ABI is not complete yet.
            raise FlamiaError(f"flamia: {path} does not export the full C ABI: {e}") from e

    def _bind(self) -> None:
        d = self._dll
        args_p = ctypes.POINTER(AttentionArgs)
        size_t = ctypes.c_size_t
        self._sig(d.flamia_qkv8_bytes, size_t,
                  [ctypes.c_int64, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                   ctypes.c_int, ctypes.c_int32])
        self._sig(d.flamia_backward_workspace_bytes, size_t,
                  [ctypes.c_int64, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                   ctypes.c_int])
        self._sig(d.flamia_backward_workspace_bytes_for, size_t, [args_p])
        self._sig(d.flamia_backward_dq_path, ctypes.c_int,
                  [ctypes.c_int, ctypes.c_int32, ctypes.POINTER(ctypes.c_int)])
        self._sig(d.flamia_quantize_qkv, ctypes.c_int, [args_p, ctypes.c_void_p, size_t, ctypes.c_int32])
        self._sig(d.flamia_forward, ctypes.c_int,
                  [args_p, Tensor, Tensor, ctypes.c_void_p, size_t, ctypes.c_int32])
        self._sig(d.flamia_backward, ctypes.c_int,
                  [args_p, Tensor, Tensor, Tensor, ctypes.c_void_p, size_t, ctypes.c_void_p, size_t,
                   Tensor, Tensor, Tensor])
        self._sig(d.flamia_check_errors, ctypes.c_int, [ctypes.c_int32])
        self._sig(d.flamia_last_error, ctypes.c_char_p, [])
        self._sig(d.flamia_gpu_available, ctypes.c_int32, [])
        self._sig(d.flamia_version_string, ctypes.c_char_p, [])

    @staticmethod
    def _sig(fn, restype, argtypes) -> None:
        fn.restype = restype
        fn.argtypes = argtypes

    @property
    def dll(self) -> ctypes.CDLL:
        """The raw handle, for callers (tests) that want to make the C calls themselves."""
        return self._dll

    # -- helpers ------------------------------------------------------------------------
    def last_error(self) -> str:
        msg = self._dll.flamia_last_error()
        return msg.decode("utf-8", "replace") if msg else ""

    def check(self, status: int, what: str) -> None:
        if status != SUCCESS:
            msg = self.last_error() or "(no message)"
            name = STATUS_NAMES.get(status, str(status))
            raise FlamiaError(f"{msg} [{what}: {name}]")

    def version(self) -> str:
        v = self._dll.flamia_version_string()
        return v.decode() if v else "unknown"

    def gpu_available(self) -> bool:
        return bool(self._dll.flamia_gpu_available())

    def qkv8_bytes(self, total_tokens: int, num_docs: int, hq: int, hkv: int, head_dim: int,
                   recipe: int, for_backward: bool) -> int:
        return int(self._dll.flamia_qkv8_bytes(total_tokens, num_docs, hq, hkv, head_dim, recipe,
                                               1 if for_backward else 0))

    def backward_workspace_bytes(self, total_tokens: int, num_docs: int, hq: int, hkv: int, head_dim: int,
                                 recipe: int) -> int:
        """The workspace every backward call with these sizes needs, without the stored dS
        (0 for invalid sizes, which the backward call itself then reports)."""
        return int(self._dll.flamia_backward_workspace_bytes(total_tokens, num_docs, hq, hkv, head_dim, recipe))

    def backward_workspace_bytes_for(self, args: AttentionArgs) -> int:
        """The workspace of a backward call with these arguments, every option included (0 for
        host calls, and for invalid arguments, which the backward call itself then reports)."""
        return int(self._dll.flamia_backward_workspace_bytes_for(ctypes.byref(args)))

    def backward_dq_path(self, recipe: int, head_dim: int) -> int:
        """How the device backward forms dQ under FLAMIA_BWD_DQ (DQ_RECOMPUTE, DQ_STORED,
        DQ_STORED_REQUIRED or DQ_FUSED; flamia.h); FlamiaError naming an invalid value."""
        path = ctypes.c_int(0)
        self.check(self._dll.flamia_backward_dq_path(recipe, head_dim, ctypes.byref(path)), "flamia_backward_dq_path")
        return path.value

    def quantize_qkv(self, args: AttentionArgs, qkv8: int, qkv8_bytes: int, for_backward: bool) -> None:
        st = self._dll.flamia_quantize_qkv(ctypes.byref(args), qkv8 or None, qkv8_bytes,
                                           1 if for_backward else 0)
        self.check(st, "flamia_quantize_qkv")

    def forward(self, args: AttentionArgs, out: Tensor, lse: Tensor, qkv8: int, qkv8_bytes: int,
                qkv8_filled: bool = False) -> None:
        st = self._dll.flamia_forward(ctypes.byref(args), out, lse, qkv8 or None, qkv8_bytes,
                                      1 if qkv8_filled else 0)
        self.check(st, "flamia_forward")

    def check_errors(self, device: int = -1) -> None:
        self.check(self._dll.flamia_check_errors(device), "flamia_check_errors")

    def backward(self, args: AttentionArgs, dout: Tensor, out: Tensor, lse: Tensor, qkv8: int,
                 qkv8_bytes: int, workspace: int, workspace_bytes: int, dq: Tensor, dk: Tensor,
                 dv: Tensor) -> None:
        st = self._dll.flamia_backward(ctypes.byref(args), dout, out, lse, qkv8 or None, qkv8_bytes,
                                       workspace or None, workspace_bytes, dq, dk, dv)
        self.check(st, "flamia_backward")


_lock = threading.Lock()
_lib: Optional[Library] = None


def get() -> Library:
    """Load the library once (thread-safe); raise FlamiaError saying where it looked."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            if path is None:
                tried = ", ".join(str(p) for p in candidate_paths())
                raise FlamiaError(
                    "flamia: libflamia.so not found (tried: " + tried + "). Install the package "
                    "with pip (which builds it with CMake), build it with CMake into ./build, "
                    "or set FLAMIA_LIBRARY=/path/to/libflamia.so"
                )
            _lib = Library(path)
    return _lib


def available() -> bool:
    """True when the library loads (says nothing about the GPU)."""
    try:
        get()
        return True
    except FlamiaError:
        return False
