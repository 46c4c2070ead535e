#!/usr/bin/env python3
"""The basic blocks of a kernel's loops, from `cuobjdump -sass` text: where a loop's
instructions are, per block, with the block's opcode mix. For counting the instructions a tile
costs on each path of a mainloop (masked or not, whole-tile sigma or per-row) without a GPU.

    cuobjdump -sass build/libflamia.so > flamia.sass        (or a -cubin of one .cu file)
    python3 tools/sass_blocks.py flamia.sass --kernel 'dkdv_kernelILi128ELb1ELb0ELb1E'

cuobjdump ships with the CUDA toolkit, or as the `nvidia-cuda-cuobjdump` Python wheel where
the toolkit lacks it (it runs nvdisasm: the `nvidia-cuda-nvdisasm` wheel's, on PATH).
--kernel is a regular expression on the mangled name (the first match); --min N hides blocks
of fewer than N instructions; --loop K picks the K-th loop (innermost first; default 0) of
those of at least --loop-min instructions (default 50). A block is a run of instructions
entered only at its start; the path a tile takes through them is the caller's reading (the
branches are printed).
"""
import argparse
import collections
import re
import sys

INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def kernel_instructions(path, pattern):
    name, out = None, []
    for line in open(path):
        m = re.search(r"Function : (\S+)", line)
        if m:
            if name is not None:
                break
            if re.search(pattern, m.group(1)):
                name = m.group(1)
            continue
        if name is not None:
            m = INSTR.match(line)
            if m:
                out.append((int(m.group(1), 16), m.group(2)))
    return name, out


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sass")
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--loop", type=int, default=0)
    ap.add_argument("--min", type=int, default=1)
    ap.add_argument("--loop-min", type=int, default=50)
    args = ap.parse_args()
    name, ins = kernel_instructions(args.sass, args.kernel)
    if name is None:
        sys.exit(f"no kernel matches {args.kernel!r}")
    print(f"kernel {name}: {len(ins)} instructions")
    # Loops: backward branches (a jump to an earlier address) of at least --loop-min
    # instructions, innermost (shortest) first. The out-of-line retries of mbarrier waits,
    # placed after the last EXIT and jumping back into the body, are not loops of the body.
    last_exit = max((a for a, t in ins if opcode(t) == "EXIT"), default=ins[-1][0])
    loops = sorted({(int(m.group(1), 16), a) for a, t in ins if a < last_exit
                    for m in [BRANCH.search(t)] if m and int(m.group(1), 16) <= a - 16 * args.loop_min},
                   key=lambda x: x[1] - x[0])
    for k, (lo, hi) in enumerate(loops):
        print(f"  loop {k}: {lo:#x} .. {hi:#x}, {(hi - lo) // 16 + 1} instructions")
    if not loops:
        return
    lo, hi = loops[min(args.loop, len(loops) - 1)]
    body = [(a, t) for a, t in ins if lo <= a <= hi]
    leaders = {lo}
    for a, t in body:
        m = BRANCH.search(t)
        if m:
            leaders.add(int(m.group(1), 16))
            leaders.add(a + 16)
    blocks = []
    for a, t in body:
        if a in leaders or not blocks:
            blocks.append((a, []))
        blocks[-1][1].append(t)
    print(f"blocks of loop {min(args.loop, len(loops) - 1)}:")
    for a, texts in blocks:
        if len(texts) < args.min:
            continue
        mix = collections.Counter(opcode(t).split(".")[0] for t in texts)
        top = ", ".join(f"{op} {n}" for op, n in mix.most_common(8))
        print(f"  {a:#07x}  {len(texts):5d}  ends: {texts[-1][:48]:48s} | {top}")


if __name__ == "__main__":
    main()
