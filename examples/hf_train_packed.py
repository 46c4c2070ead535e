"""Train a small Hugging Face Llama (random init) on packed documents with flamia attention.

    pip install --no-build-isolation . && pip install 'transformers>=4.53'
    python examples/hf_train_packed.py [--steps 60] [--recipe fp8|fp8_mixed] [--low-memory]

DataCollatorWithFlattening packs each batch of documents into one row without padding;
`return_flash_attn_kwargs=True` adds cu_seq_lens_q/k for them, which flamia uses as its
cu_seqlens (no host synchronisation per layer). The three lines that switch a model to flamia:

    import flamia.integrations.transformers as flamia_hf
    flamia_hf.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="flamia_fp8")

The documents are synthetic (arithmetic progressions modulo the vocabulary, so the loss has
something to learn); nothing is downloaded. Needs a CUDA GPU with sm_90 (H100/H200).
"""

import argparse
import random
import sys

try:
    import torch
except ImportError:
    sys.exit("hf_train_packed.py: PyTorch is not installed (pip install torch)")
try:
    import transformers
    from transformers import AutoModelForCausalLM, DataCollatorWithFlattening, LlamaConfig
except ImportError:
    sys.exit("hf_train_packed.py: transformers is not installed (pip install 'transformers>=4.53')")
try:
    import flamia
    import flamia.integrations.transformers as flamia_hf
except ImportError:
    sys.exit("hf_train_packed.py: the flamia package is not importable; install it with "
             "`pip install --no-build-isolation .` or run with PYTHONPATH=python")
from tqdm.auto import tqdm  # a dependency of transformers

VOCAB = 256


def synthetic_documents(count: int, seed: int):
    """Documents of 32-512 tokens: a, a + s, a + 2s, ... modulo VOCAB (a, s random per document)."""
    rng = random.Random(seed)
    docs = []
    for _ in range(count):
        n, a, s = rng.randint(32, 512), rng.randrange(VOCAB), rng.randrange(1, 17)
        docs.append({"input_ids": [(a + i * s) % VOCAB for i in range(n)]})
    return docs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--docs-per-batch", type=int, default=16)
    parser.add_argument("--recipe", choices=sorted(flamia.RECIPES), default="fp8")
    parser.add_argument("--low-memory", action="store_true",
                        help="fp8_mixed in a BF16 attention's memory (attn_implementation "
                             "'flamia_fp8_mixed_low_memory'; the same gradients, bit for bit)")
    args = parser.parse_args()
    if args.low_memory and args.recipe != "fp8_mixed":
        parser.error("--low-memory is fp8_mixed's (fp8 keeps less than a BF16 attention already)")

    if not torch.cuda.is_available() or not flamia.gpu_available():
        sys.exit("hf_train_packed.py: needs a CUDA GPU with sm_90 (H100/H200) and libflamia.so built with CUDA")
    names = flamia_hf.register()
    attn = "flamia_" + args.recipe + ("_low_memory" if args.low_memory else "")
    assert attn in names

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, attention_dropout=0.0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    model = model.to(device="cuda", dtype=torch.bfloat16).train()
    print(f"transformers {transformers.__version__}, {flamia.library_version()}, "
          f"attn_implementation={model.config._attn_implementation!r}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")

    collate = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    loader = torch.utils.data.DataLoader(synthetic_documents(args.steps * args.docs_per_batch, seed=1),
                                         batch_size=args.docs_per_batch, shuffle=True, collate_fn=collate)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)

    bar = tqdm(loader, total=args.steps, desc=f"train ({args.recipe})")
    for step, batch in enumerate(bar):
        # One row of all the batch's tokens; labels are -100 at every document start.
        batch = {k: v.to("cuda", non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
        loss = model(**batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == args.steps - 1:
            value = loss.item()  # the loop's only host synchronisation, every 10 steps
            bar.set_postfix(loss=f"{value:.3f}", tokens=batch["input_ids"].shape[1])
            tqdm.write(f"step {step:3d}  loss {value:.4f}")
    # Invalid cu_seqlens would have produced NaN outputs and a recorded fault; surface it.
    flamia.check_errors()


if __name__ == "__main__":
    main()
