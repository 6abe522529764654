"""transformers' eager `generate` on a synthesised checkpoint, for the side-by-side
table of issue 9: B random prompts of 128 tokens, 64 greedy tokens each, bf16 on
the GPU. Prints one line per batch size: generated tokens per second.

    python3 bench/cuda/hf_bench.py CHECKPOINT_DIR 1,32,128
"""
import sys
import time

import torch
import transformers


def main():
    path, batches = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    vocab = cfg.vocab_size
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
        dt = run(b, 128, 64)
        print(f"batch {b:4d}: {dt * 1e3:9.1f} ms, {b * 64 / dt:9.1f} gen tok/s")


if __name__ == "__main__":
    main()
