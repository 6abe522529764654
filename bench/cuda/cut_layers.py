"""Writes a config.json cut to its first N decoder layers (per-layer widths,
what the kernels see, stay the real model's): the benchmarks' way to fit a
large model's checkpoint on the GPU host's disk and into one call.

    python3 bench/cuda/cut_layers.py CONFIG.json LAYERS OUT.json
"""
import json
import sys

config = json.load(open(sys.argv[1]))
layers = int(sys.argv[2])
text = config.get("text_config", config)
text["num_hidden_layers"] = layers
if "layer_types" in text:
    text["layer_types"] = text["layer_types"][:layers]
json.dump(config, open(sys.argv[3], "w"), indent=1)
