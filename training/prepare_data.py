#!/usr/bin/env python3
"""Build the byte-level English corpus used by the training validation runs.

Source: the HTML documentation shipped in Debian packages, fetched with `apt-get download`, unpacked with `dpkg-deb -x`, converted to plain text
with the standard library's html.parser. One HTML page is one document; the
train/held-out split is decided per document from a hash of its path, so it does not
depend on file-system order or on which other pages exist.

Named corpora (--corpus; CORPORA below): "default" = python3.11-doc, postgresql-doc-15,
python-django-doc, written to training/data/; "alt" = git-doc, debian-reference-en,
sphinx-doc, cmake-doc (documentation the model and its settings were never tuned on),
written to training/data-alt/. --packages overrides a corpus' package list; meta.json
records the corpus name and the packages actually used.

Output (training/data/ or training/data-<name>/):
  train.bin, val.bin                 raw UTF-8 bytes of all documents, concatenated (uint8)
  train_offsets.bin, val_offsets.bin uint32 little-endian, n_docs+1 byte offsets into *.bin
  meta.json                          sources, sizes, document names, checksums

Tokens are bytes (0..255); the loader adds BOS=256 at each document start, so the
model's vocabulary is 257 (padded). Only the standard library is used here, so the
script runs before numpy/torch are installed.

Usage: python training/prepare_data.py [--corpus alt] [--packages python3.11-doc ...] [--max-mb 40]
"""
from __future__ import annotations

import argparse
import hashlib
import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CORPORA: dict[str, list[str]] = {
    "default": ["python3.11-doc", "postgresql-doc-15", "python-django-doc"],
    "alt": ["git-doc", "debian-reference-en", "sphinx-doc", "cmake-doc"],
}


def corpus_dir(name: str) -> Path:
    """training/data for the default corpus (where earlier runs expect it), else data-<name>."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"--corpus {name!r}: use letters, digits, '.', '_' or '-'")
    return HERE / ("data" if name == "default" else f"data-{name}")

# Pages that are listings rather than prose: they would teach the model index syntax.
SKIP_NAME = re.compile(r"^(genindex.*|py-modindex|search|modindex|copyright|license|bugs|download)\.html$")

BLOCK_TAGS = {
    "p", "div", "section", "article", "br", "li", "ul", "ol", "dl", "dt", "dd", "tr",
    "table", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "hr", "figure",
    "caption", "header", "footer", "main", "nav", "td", "th",
}
SKIP_TAGS = {"script", "style", "head", "noscript", "template"}


class _TextExtractor(html.parser.HTMLParser):
    """Collects visible text. If the page marks a main region (Sphinx: role="main"),
    only that region is kept, so navigation bars and sidebars do not repeat in every
    document."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.all_parts: list[str] = []
        self.main_parts: list[str] = []
        self._skip_depth = 0
        self._pre_depth = 0
        self._main_depth = 0  # >0 while inside the main region
        self._stack: list[str] = []
        self._headerlink_depth = 0

    def _emit(self, s: str) -> None:
        self.all_parts.append(s)
        if self._main_depth > 0:
            self.main_parts.append(s)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        void = tag in {"br", "hr", "img", "meta", "link", "input", "wbr"}
        if not void:
            self._stack.append(tag)
        if tag in SKIP_TAGS:
            self._skip_depth += 1
        if tag == "pre":
            self._pre_depth += 1
        if self._main_depth > 0 and not void:
            self._main_depth += 1
        elif a.get("role") == "main" or (tag == "main" and self._main_depth == 0):
            self._main_depth = 1
        # Sphinx's pilcrow anchors ("¶") after every heading are noise.
        if tag == "a" and "headerlink" in (a.get("class") or ""):
            self._headerlink_depth += 1
        if tag in BLOCK_TAGS:
            self._emit("\n")

    def handle_endtag(self, tag: str) -> None:
        # Pop to the matching tag; tolerate sloppy HTML by ignoring unmatched end tags.
        if tag not in self._stack:
            return
        while self._stack:
            t = self._stack.pop()
            if t in SKIP_TAGS:
                self._skip_depth = max(0, self._skip_depth - 1)
            if t == "pre":
                self._pre_depth = max(0, self._pre_depth - 1)
            if t == "a" and self._headerlink_depth > 0:
                self._headerlink_depth -= 1
            if self._main_depth > 0:
                self._main_depth -= 1
            if t in BLOCK_TAGS:
                self._emit("\n")
            if t == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._skip_depth > 0 or self._headerlink_depth > 0:
            return
        if self._pre_depth > 0:
            self._emit("\x00PRE" + data + "\x00END")  # protected from whitespace folding
        else:
            self._emit(re.sub(r"\s+", " ", data))


def html_to_text(raw: str) -> str:
    p = _TextExtractor()
    p.feed(raw)
    p.close()
    text = "".join(p.main_parts) if p.main_parts else "".join(p.all_parts)
    # Fold whitespace outside <pre> blocks, keep code blocks verbatim.
    out: list[str] = []
    for i, piece in enumerate(re.split(r"\x00PRE|\x00END", text)):
        if i % 2 == 1:
            out.append("\n" + piece.strip("\n") + "\n")
        else:
            piece = re.sub(r"[ \t]*\n[ \t]*", "\n", piece)
            piece = re.sub(r"[ \t]+", " ", piece)
            out.append(piece)
    text = "".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    return text + "\n"


def is_heldout(name: str, heldout_pct: float) -> bool:
    """Deterministic split from the document's path only."""
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return (h % 10_000) < heldout_pct * 100


def fetch_package(pkg: str, workdir: Path) -> tuple[Path, str]:
    """apt-get download + dpkg-deb -x; returns the extracted root and the .deb name."""
    dl = workdir / "deb"
    dl.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", pkg], cwd=dl, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    debs = sorted(dl.glob(f"{pkg}_*.deb"))
    if not debs:
        raise RuntimeError(f"apt-get download {pkg} produced no .deb")
    root = workdir / "x" / pkg
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(root)], check=True)
    return root, debs[-1].name


def collect_documents(root: Path, pkg: str) -> list[tuple[str, bytes]]:
    docs: list[tuple[str, bytes]] = []
    for path in sorted(root.rglob("*.html")):
        # _modules: Sphinx source-code listings, code rather than prose.
        if SKIP_NAME.match(path.name) or {"_static", "_sources", "_modules"} & set(path.parts):
            continue
        raw = path.read_bytes().decode("utf-8", errors="replace")
        text = html_to_text(raw)
        if len(text) < 200:  # redirect stubs, empty pages
            continue
        name = f"{pkg}:{path.relative_to(root).as_posix()}"
        docs.append((name, text.encode("utf-8")))
    return docs


def write_split(out: Path, split: str, docs: list[tuple[str, bytes]]) -> dict[str, object]:
    offsets = [0]
    with open(out / f"{split}.bin", "wb") as f:
        for _, b in docs:
            f.write(b)
            offsets.append(offsets[-1] + len(b))
    with open(out / f"{split}_offsets.bin", "wb") as f:
        f.write(struct.pack(f"<{len(offsets)}I", *offsets))
    sha = hashlib.sha256((out / f"{split}.bin").read_bytes()).hexdigest()
    return {"n_docs": len(docs), "n_bytes": offsets[-1], "sha256": sha,
            "docs": [n for n, _ in docs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="default",
                    help=f"corpus name: {', '.join(CORPORA)} or a new name together with --packages")
    ap.add_argument("--packages", nargs="+", default=None,
                    help="Debian packages whose HTML documentation forms the corpus (default: the corpus' list)")
    ap.add_argument("--out", type=Path, default=None, help="default: training/data or training/data-<corpus>")
    ap.add_argument("--heldout-pct", type=float, default=5.0, help="percent of documents held out")
    ap.add_argument("--max-mb", type=float, default=40.0,
                    help="cap on total corpus size (documents beyond it are dropped, in hash order)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the data exists")
    args = ap.parse_args()
    if args.packages is None:
        if args.corpus not in CORPORA:
            ap.error(f"--corpus {args.corpus!r} is not one of {', '.join(CORPORA)}; name its --packages")
        args.packages = CORPORA[args.corpus]
    try:
        out: Path = args.out or corpus_dir(args.corpus)
    except ValueError as e:
        ap.error(str(e))
    if (out / "meta.json").exists() and not args.force:
        print(f"{out}/meta.json exists; use --force to rebuild", flush=True)
        return 0
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            print(f"error: {tool} not found (this script needs a Debian-like system)", file=sys.stderr)
            return 1

    all_docs: list[tuple[str, bytes]] = []
    sources: list[str] = []
    with tempfile.TemporaryDirectory(prefix="flamia-corpus-") as tmp:
        for pkg in args.packages:
            try:
                root, deb = fetch_package(pkg, Path(tmp))
            except subprocess.CalledProcessError as e:
                err = e.stderr.decode(errors="replace") if e.stderr else ""
                print(f"error: could not fetch {pkg}: {err.strip()}\n"
                      f"(run `apt-get update` first, or pick a package `apt-cache search doc` lists)",
                      file=sys.stderr)
                return 1
            docs = collect_documents(root, pkg)
            print(f"{deb}: {len(docs)} documents, {sum(len(b) for _, b in docs) / 1e6:.1f} MB of text",
                  flush=True)
            all_docs.extend(docs)
            sources.append(deb)

    # Cap the size deterministically: order by name hash, keep a prefix.
    all_docs.sort(key=lambda d: hashlib.sha256(d[0].encode()).digest())
    cap = int(args.max_mb * 1e6)
    kept: list[tuple[str, bytes]] = []
    total = 0
    for name, b in all_docs:
        if total + len(b) > cap:
            continue
        kept.append((name, b))
        total += len(b)
    kept.sort(key=lambda d: d[0])  # stable on-disk order, by path

    train = [d for d in kept if not is_heldout(d[0], args.heldout_pct)]
    val = [d for d in kept if is_heldout(d[0], args.heldout_pct)]
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "name": args.corpus,
        "packages": list(args.packages),
        "sources": sources,
        "tokenizer": "bytes; BOS=256 added by the loader at each document start",
        "vocab_size": 257,
        "heldout_pct": args.heldout_pct,
        "train": write_split(out, "train", train),
        "val": write_split(out, "val", val),
    }
    with open(out / "meta.json", "w") as f:
        json.dump(meta, f, indent=1)
    t, v = meta["train"], meta["val"]
    print(f"wrote {out}: train {t['n_docs']} docs / {t['n_bytes'] / 1e6:.2f} MB, "
          f"val {v['n_docs']} docs / {v['n_bytes'] / 1e6:.2f} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
