"""tools/cubin_text_diff.py on synthetic ELF files (no GPU, no build): the same code under
two anonymous-namespace hashes is "same", a changed byte or a missing kernel fails, --only
selects."""
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ANON_A = "44_GLOBAL__N__c7fc6133_11_backward_cu_ec231620"
ANON_B = "44_GLOBAL__N__0a1b2c3d_11_backward_cu_99887766"


def elf(sections):
    """A minimal 64-bit little-endian ELF file: a null section, the given (name, bytes)
    sections, and the section-name string table last."""
    names = b"\0"
    offsets = []
    for name, _ in sections:
        offsets.append(len(names))
        names += name.encode() + b"\0"
    shstr_name = len(names)
    names += b".shstrtab\0"
    body = b""
    placed = []
    base = 64
    for _, data in sections:
        placed.append((base + len(body), len(data)))
        body += data
    str_off = base + len(body)
    body += names
    shoff = base + len(body)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, len(sections) + 2, len(sections) + 1)
    shdrs = b"\0" * 64
    for (off, size), name_off in zip(placed, offsets):
        shdrs += struct.pack("<IIQQQQ", name_off, 1, 6, 0, off, size) + b"\0" * 24
    shdrs += struct.pack("<IIQQQQ", shstr_name, 3, 0, 0, str_off, len(names)) + b"\0" * 24
    return bytes(header) + body + shdrs


def run(tmp_path, a, b, *args):
    pa, pb = tmp_path / "a.cubin", tmp_path / "b.cubin"
    pa.write_bytes(elf(a))
    pb.write_bytes(elf(b))
    return subprocess.run([sys.executable, str(ROOT / "tools" / "cubin_text_diff.py"), str(pa), str(pb), *args],
                          capture_output=True, text=True)


def kernel(anon, name):
    return f".text._ZN6flamia4sm90{anon}{name}"


def test_same_code_under_another_file_hash_is_same(tmp_path):
    a = [(kernel(ANON_A, "9dq_kernelILi128ELb1EEEvNS1_7BwdArgsE"), b"\x01\x02\x03\x04"), (".nv.info", b"x")]
    b = [(kernel(ANON_B, "9dq_kernelILi128ELb1EEEvNS1_7BwdArgsE"), b"\x01\x02\x03\x04")]
    r = run(tmp_path, a, b)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("same (4 bytes)")


def test_a_changed_byte_or_a_missing_kernel_fails(tmp_path):
    a = [(kernel(ANON_A, "9dq_kernelE"), b"\x01\x02"), (kernel(ANON_A, "11dkdv_kernelE"), b"\x05")]
    b = [(kernel(ANON_A, "9dq_kernelE"), b"\x01\x03")]
    r = run(tmp_path, a, b)
    assert r.returncode == 1
    assert "differs (2 -> 2 bytes)" in r.stdout and "only in before" in r.stdout
    r = run(tmp_path, a, b, "--only", "dkdv")
    assert r.returncode == 1 and "dq_kernel" not in r.stdout
    r = run(tmp_path, a, a, "--only", "dq_kernel")
    assert r.returncode == 0 and "dkdv" not in r.stdout


def test_by_name_matches_kernels_moved_into_a_namespace(tmp_path):
    # The same instantiations, once in the file's anonymous namespace and once in
    # flamia::sm90::bwd (its parameter type with it): only --by-name pairs them.
    before = [(kernel(ANON_A, "11dkdv_kernelILi128ELb1ELb0ELb0EEEvNS1_7BwdArgsE"), b"\x01\x02"),
              (kernel(ANON_A, "11dkdv_kernelILi64ELb1ELb0ELb0EEEvNS1_7BwdArgsE"), b"\x03")]
    after = [(".text._ZN6flamia4sm903bwd11dkdv_kernelILi128ELb1ELb0ELb0EEEvNS1_7BwdArgsE", b"\x01\x02"),
             (".text._ZN6flamia4sm903bwd11dkdv_kernelILi64ELb1ELb0ELb0EEEvNS1_7BwdArgsE", b"\x03")]
    assert run(tmp_path, before, after).returncode == 1
    r = run(tmp_path, before, after, "--by-name")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "same (2 bytes): dkdv_kernel<Li128,Lb1,Lb0,Lb0>" in r.stdout
    assert "same (1 bytes): dkdv_kernel<Li64,Lb1,Lb0,Lb0>" in r.stdout
    # Different template arguments stay different kernels; a changed byte still fails.
    after[1] = (after[1][0], b"\x04")
    r = run(tmp_path, before, after, "--by-name")
    assert r.returncode == 1 and "differs (1 -> 1 bytes): dkdv_kernel<Li64,Lb1,Lb0,Lb0>" in r.stdout


def test_pair_counts_the_instructions_that_differ(tmp_path):
    # A kernel that gained a template argument: --pair names both; one changed 16-byte
    # instruction of three is counted, identical code is "same", an ambiguous name is refused.
    code = bytes(range(48))
    changed = code[:16] + b"\xff" + code[17:]
    before = [(kernel(ANON_A, "19forward_fast_kernelILi64EEEvNS1_6ParamsE"), code)]
    after = [(kernel(ANON_B, "19forward_fast_kernelILi64ELb0EEEvNS1_6ParamsE"), changed),
             (kernel(ANON_B, "19forward_fast_kernelILi64ELb1EEEvNS1_6ParamsE"), code)]
    r = run(tmp_path, before, after, "--pair", "kernelILi64EE", "kernelILi64ELb0")
    assert r.returncode == 1 and "1 of 3 instructions differ" in r.stdout, r.stdout
    r = run(tmp_path, before, after, "--pair", "kernelILi64EE", "kernelILi64ELb1")
    assert r.returncode == 0 and r.stdout.startswith("same (48 bytes, 0 of 3"), r.stdout
    r = run(tmp_path, before, after, "--pair", "kernelILi64EE", "kernelILi64")
    assert r.returncode == 2 and "2 kernels match" in r.stdout
