#!/usr/bin/env python3
"""Whether two builds compiled every kernel to the same machine code, without a GPU or a
disassembler: compares the .text.<kernel> sections of two ELF cubins byte for byte.

    nvcc ... -cubin -o before.cubin src/sm90/backward.cu      (then change the source)
    nvcc ... -cubin -o after.cubin src/sm90/backward.cu
    python3 tools/cubin_text_diff.py before.cubin after.cubin [--only dkdv_kernel]

For refactors and for changes meant to touch only some kernels ("the default kernels are
byte-identical"). Kernel names are compared with the anonymous namespace's per-file hash
replaced, since it differs between compilations of a renamed or moved file. Prints one line
per kernel (same / differs / only in one) and exits 1 when any selected kernel differs or is
missing from one side.
"""
import argparse
import re
import struct
import sys
from typing import Dict

# The anonymous namespace of a translation unit: <length>_GLOBAL__N__<hash8>_<n>_<file>_<hash8>.
_ANON = re.compile(r"\d+_GLOBAL__N__[0-9a-f]{8}_\d+_\w+?_[0-9a-f]{8}")


def normalize(name: str) -> str:
    return _ANON.sub("<anon>", name)


def text_sections(path: str) -> Dict[str, bytes]:
    """The .text.* sections of a 64-bit little-endian ELF file, by normalized kernel name."""
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    str_off, str_size = headers[shstrndx][4], headers[shstrndx][5]
    names = data[str_off:str_off + str_size]
    out = {}
    for name_off, _type, _flags, _addr, off, size in headers:
        end = names.index(b"\0", name_off)
        name = names[name_off:end].decode("utf-8", "replace")
        if name.startswith(".text."):
            out[normalize(name[len(".text."):])] = data[off:off + size]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--only", default="", help="compare only kernels whose name contains this")
    args = ap.parse_args()
    a, b = text_sections(args.before), text_sections(args.after)
    bad = 0
    for name in sorted(set(a) | set(b)):
        if args.only not in name:
            continue
        if name not in a or name not in b:
            print(f"only in {'after' if name not in a else 'before'}: {name}")
            bad += 1
        elif a[name] == b[name]:
            print(f"same ({len(a[name])} bytes): {name}")
        else:
            print(f"differs ({len(a[name])} -> {len(b[name])} bytes): {name}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
