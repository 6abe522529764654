"""transformers' eager `generate` on a synthesised checkpoint, for the side-by-side
table of issue 9: B random prompts of 128 tokens, 64 greedy tokens each, bf16 on
the GPU. Prints one line per batch size: generated tokens per second (and the
peak GPU memory torch allocated during that batch).

    python3 bench/cuda/hf_bench.py CHECKPOINT_DIR 1,32,128

Dense and mixture-of-experts checkpoints alike (Qwen3-MoE, Qwen3.5-MoE). For
MoE models transformers runs the experts through its experts backend
(`experts_implementation`: "eager", "grouped_mm", "batched_mm"); its own default
unless HF_BENCH_EXPERTS names one. The line `experts: ...` says which ran.
A batch that runs out of GPU memory prints `batch N: out of memory` and the
next batch still runs.
"""
import os
import sys
import time

import torch
import transformers


def main():
    path, batches = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    kwargs = {}
    if os.environ.get("HF_BENCH_EXPERTS"):
        kwargs["experts_implementation"] = os.environ["HF_BENCH_EXPERTS"]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, attn_implementation="eager", **kwargs).cuda().eval()
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    vocab = cfg.vocab_size
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if experts:
        impl = getattr(model.config, "_experts_implementation", None) or getattr(
            cfg, "_experts_implementation", None)
        print(f"model: {type(model).__name__}, {experts} experts, experts: {impl or 'unknown (this transformers has no experts backend setting)'}")
    else:
        print(f"model: {type(model).__name__}")
    gen = torch.Generator(device="cuda").manual_seed(1)

    def run(b, prompt, new):
        ids = torch.randint(0, vocab, (b, prompt), device="cuda", generator=gen)
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                           min_new_tokens=new, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    run(1, 16, 4)  # warm-up
    for b in batches:
        torch.cuda.reset_peak_memory_stats()
        try:
            dt = run(b, 128, 64)
        except torch.cuda.OutOfMemoryError:
            print(f"batch {b:4d}: out of memory")
            torch.cuda.empty_cache()
            continue
        peak = torch.cuda.max_memory_allocated() / 2**30
        print(f"batch {b:4d}: {dt * 1e3:9.1f} ms, {b * 64 / dt:9.1f} gen tok/s, peak GPU {peak:.1f} GiB")


if __name__ == "__main__":
    main()
