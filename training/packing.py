"""Deterministic packed batches from the byte corpus written by prepare_data.py.

Documents longer than `max_doc_len` are cut into pieces; each piece starts with BOS and
is its own attention document. Per epoch the pieces are shuffled with a seed derived from
(seed, epoch), laid end to end into one token stream, and pack i of the epoch is the window
[i*T, (i+1)*T] of that stream (T+1 tokens: inputs and shifted targets). A piece cut by a
window edge becomes two documents. The batch for a global step therefore depends only on
(seed, step), so every recipe sees the same data in the same order and a resumed run
continues exactly where it stopped.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BOS = 256


@dataclass
class Pack:
    inputs: np.ndarray      # [T] int64
    targets: np.ndarray     # [T] int64
    cu_seqlens: np.ndarray  # [B+1] int32
    max_seqlen: int


class PackedCorpus:
    def __init__(self, data_dir: Path, split: str, pack_tokens: int, max_doc_len: int,
                 seed: int, shuffle: bool) -> None:
        raw = np.fromfile(data_dir / f"{split}.bin", dtype=np.uint8)
        offs = np.fromfile(data_dir / f"{split}_offsets.bin", dtype="<u4").astype(np.int64)
        if offs[-1] != raw.size:
            raise ValueError(f"{split}: offsets do not match {split}.bin (rerun prepare_data.py --force)")
        self.raw = raw
        self.T = pack_tokens
        self.seed = seed
        self.shuffle = shuffle
        piece = max_doc_len - 1  # room for BOS
        starts: list[int] = []
        lens: list[int] = []
        for a, b in zip(offs[:-1], offs[1:]):
            for s in range(int(a), int(b), piece):
                starts.append(s)
                lens.append(min(piece, int(b) - s))
        self.piece_start = np.asarray(starts, dtype=np.int64)
        self.piece_len = np.asarray(lens, dtype=np.int64)
        self.stream_len = int((self.piece_len + 1).sum())
        self.packs_per_epoch = (self.stream_len - 1) // self.T
        if self.packs_per_epoch < 1:
            raise ValueError(f"{split}: {self.stream_len} tokens < one pack of {self.T}")
        self._epoch = -1
        self._stream = np.empty(0, dtype=np.int64)
        self._doc_starts = np.empty(0, dtype=np.int64)

    @property
    def n_tokens(self) -> int:
        return self.stream_len

    def _build_epoch(self, epoch: int) -> None:
        order = np.arange(self.piece_start.size)
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(order)
        lens = self.piece_len[order] + 1
        doc_starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
        stream = np.empty(self.stream_len, dtype=np.int64)
        for ds, ps, pl in zip(doc_starts, self.piece_start[order], self.piece_len[order]):
            stream[ds] = BOS
            stream[ds + 1:ds + 1 + pl] = self.raw[ps:ps + pl]
        self._stream, self._doc_starts, self._epoch = stream, doc_starts, epoch

    def pack(self, index: int) -> Pack:
        epoch, i = divmod(index, self.packs_per_epoch)
        if epoch != self._epoch:
            self._build_epoch(epoch)
        a, b = i * self.T, (i + 1) * self.T
        window = self._stream[a:b + 1]
        lo, hi = np.searchsorted(self._doc_starts, [a, b])
        inner = self._doc_starts[lo:hi] - a
        cu = np.unique(np.concatenate(([0], inner, [self.T]))).astype(np.int32)
        return Pack(window[:-1].copy(), window[1:].copy(), cu, int(np.diff(cu).max()))


def load_meta(data_dir: Path) -> dict:
    with open(data_dir / "meta.json") as f:
        return json.load(f)
