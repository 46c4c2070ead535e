"""One training step of a tiny attention block with flamia on packed sequences.

    pip install --no-build-isolation .        # or: PYTHONPATH=python, libflamia.so in ./build
    python examples/train_step.py

flamia.flash_attn_varlen_func takes FlashAttention's varlen arguments in the same order, so
swapping it in for flash_attn.flash_attn_varlen_func is a one-line change. Needs a CUDA GPU
with sm_90 (H100/H200) and PyTorch >= 2.4.
"""

import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit("train_step.py: PyTorch is not installed (pip install torch)")

try:
    import flamia
except ImportError:
    sys.exit("train_step.py: the flamia package is not importable; install it with "
             "`pip install --no-build-isolation .` or run with PYTHONPATH=python")

if not torch.cuda.is_available():
    sys.exit("train_step.py: needs a CUDA GPU (torch.cuda.is_available() is False)")
if not flamia.gpu_available():
    sys.exit("train_step.py: flamia found no supported GPU (needs sm_90, H100/H200) or no "
             "libflamia.so built with CUDA; see README 'Python'")

DIM, HQ, HKV, HEAD_DIM = 256, 4, 2, 64  # GQA: two query heads per k/v head
DOC_LENGTHS = [37, 300, 128, 211]        # documents packed into one sequence of T tokens


class AttentionBlock(nn.Module):
    """Pre-norm self-attention with a fused q/k/v projection, over packed documents."""

    def __init__(self, recipe: str = "fp8"):
        super().__init__()
        self.recipe = recipe
        self.norm = nn.RMSNorm(DIM) if hasattr(nn, "RMSNorm") else nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, (HQ + 2 * HKV) * HEAD_DIM, bias=False)
        self.proj = nn.Linear(HQ * HEAD_DIM, DIM, bias=False)

    def qkv_heads(self, x):
        # Views into the fused projection, no copies: flamia reads strided q/k/v as long as
        # the head dim is contiguous.
        qkv = self.qkv(self.norm(x)).view(x.shape[0], HQ + 2 * HKV, HEAD_DIM)
        return qkv[:, :HQ], qkv[:, HQ:HQ + HKV], qkv[:, HQ + HKV:]

    def forward(self, x, cu_seqlens, max_seqlen: int):
        q, k, v = self.qkv_heads(x)
        o = flamia.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                          causal=True, recipe=self.recipe)
        return x + self.proj(o.reshape(x.shape[0], HQ * HEAD_DIM))


def sdpa_per_document(q, k, v, cu):
    """Reference: float32 SDPA, one call per document, k/v heads expanded for GQA."""
    outs = []
    for s, e in zip(cu[:-1], cu[1:]):
        qd, kd, vd = (t[s:e].float().transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        kd = kd.repeat_interleave(HQ // HKV, dim=1)  # query head h reads k/v head h // (HQ/HKV)
        vd = vd.repeat_interleave(HQ // HKV, dim=1)
        outs.append(F.scaled_dot_product_attention(qd, kd, vd, is_causal=True)[0].transpose(0, 1))
    return torch.cat(outs)


def rel_l2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    cu = [0]
    for n in DOC_LENGTHS:
        cu.append(cu[-1] + n)
    T = cu[-1]
    cu_seqlens = torch.tensor(cu, dtype=torch.int32, device=dev)
    max_seqlen = max(DOC_LENGTHS)
    print(f"{flamia.library_version()}: T = {T} tokens in {len(DOC_LENGTHS)} documents, "
          f"Hq/Hkv = {HQ}/{HKV}, D = {HEAD_DIM}")

    block = AttentionBlock().to(dev, torch.bfloat16)
    opt = torch.optim.AdamW(block.parameters(), lr=1e-3)
    x = torch.randn(T, DIM, device=dev, dtype=torch.bfloat16)
    target = torch.randn_like(x)

    # One step: forward, backward (flamia's backward reuses the forward's quantized q/k/v),
    # optimizer update.
    loss = F.mse_loss(block(x, cu_seqlens, max_seqlen).float(), target.float())
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(block.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step: loss {loss.item():.4f}, grad norm {grad_norm.item():.4f}")

    # Attention output against float32 SDPA per document: expect a few 1e-2, set by E4M3's
    # 3-bit mantissa; per-token scales keep it independent of the neighbouring documents.
    with torch.no_grad():
        q, k, v = block.qkv_heads(x)
        o = flamia.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                          causal=True)
        ref = sdpa_per_document(q, k, v, cu)
        for b, (s, e) in enumerate(zip(cu[:-1], cu[1:])):
            print(f"  doc {b} ({e - s:3d} tokens): O rel L2 vs SDPA {rel_l2(o[s:e], ref[s:e]):.4f}")

    # torch.compile with fullgraph=True: flamia's custom ops trace without graph breaks.
    compiled = torch.compile(block, fullgraph=True)
    xe = x.clone().requires_grad_()
    xc = x.clone().requires_grad_()
    ye, yc = block(xe, cu_seqlens, max_seqlen), compiled(xc, cu_seqlens, max_seqlen)
    ye.float().square().sum().backward()
    yc.float().square().sum().backward()
    torch.cuda.synchronize()
    print(f"torch.compile(fullgraph=True): output rel L2 vs eager {rel_l2(yc, ye):.2e}, "
          f"dx rel L2 {rel_l2(xc.grad, xe.grad):.2e}")


if __name__ == "__main__":
    main()
