#!/usr/bin/env python3
"""Whether two builds compiled every kernel to the same machine code, without a GPU or a
disassembler: compares the .text.<kernel> sections of two ELF cubins byte for byte.

    nvcc ... -cubin -o before.cubin src/sm90/kernels/backward.cu      (then change the source)
    nvcc ... -cubin -o after.cubin src/sm90/kernels/backward.cu
    python3 tools/cubin_text_diff.py before.cubin after.cubin [--only dkdv_kernel]

For refactors and for changes meant to touch only some kernels ("the default kernels are
byte-identical"). Kernel names are compared with the anonymous namespace's per-file hash
replaced, since it differs between compilations of a renamed or moved file; --by-name
compares them by their own name and literal template arguments only (dkdv_kernel<128, true,
false, false>), for a refactor that moves kernels into another namespace. Prints one line
per kernel (same / differs / only in one) and exits 1 when any selected kernel differs or is
missing from one side. --pair BEFORE AFTER compares one kernel of each build whose names contain
those strings (a kernel that gained a template argument: --pair 'kernelILi64EE' 'kernelILi64ELb0')
and counts the 16-byte instructions that differ (a field moved in the parameters changes only
the instructions that load it).
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


def by_name(name: str) -> str:
    """A mangled kernel name's last nested component and its literal template arguments
    (_ZN6flamia4sm903bwd11dkdv_kernelILi128ELb1EEEv... -> dkdv_kernel<Li128,Lb1>); the name
    itself where it does not parse as a nested name."""
    if not name.startswith("_ZN"):
        return name
    i, last, args = 3, name, ""
    while i < len(name) and name[i].isdigit():
        j = i
        while name[j].isdigit():
            j += 1
        n = int(name[i:j])
        last, args, i = name[j:j + n], "", j + n
        if i < len(name) and name[i] == "I":  # literal template arguments: L<type><value>E ...
            i += 1
            parts = []
            while i < len(name) and name[i] == "L":
                end = name.index("E", i)
                parts.append(name[i:end])
                i = end + 1
            if i >= len(name) or name[i] != "E":
                return name  # a type argument: keep the whole name
            args, i = "<" + ",".join(parts) + ">", i + 1
    return last + args


def text_sections(path: str, key=normalize) -> Dict[str, bytes]:
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
            out[key(name[len(".text."):])] = data[off:off + size]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--only", default="", help="compare only kernels whose name contains this")
    ap.add_argument("--by-name", action="store_true",
                    help="match kernels by their own name and literal template arguments, not their namespace")
    ap.add_argument("--pair", nargs=2, metavar=("BEFORE", "AFTER"),
                    help="compare the one kernel of each build whose name contains these strings")
    args = ap.parse_args()
    key = by_name if args.by_name else normalize
    a, b = text_sections(args.before, key), text_sections(args.after, key)
    if args.pair:
        picks = []
        for sections, part in ((a, args.pair[0]), (b, args.pair[1])):
            found = [name for name in sections if part in name]
            if len(found) != 1:
                print(f"{part}: {len(found)} kernels match, want one")
                return 2
            picks.append(found[0])
        x, y = a[picks[0]], b[picks[1]]
        if len(x) != len(y):
            print(f"differs ({len(x)} -> {len(y)} bytes): {picks[0]} -> {picks[1]}")
            return 1
        n = sum(x[i:i + 16] != y[i:i + 16] for i in range(0, len(x), 16))
        print(f"{'same' if n == 0 else 'differs'} ({len(x)} bytes, {n} of {len(x) // 16} instructions differ): "
              f"{picks[0]} -> {picks[1]}")
        return 1 if n else 0
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
