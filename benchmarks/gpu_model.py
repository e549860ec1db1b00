"""A SmolLM2-135M-shaped model folder for a GPU machine that cannot hold the real file.

    python benchmarks/gpu_model.py prepare benchmarks/gpu-model   # here: config and tokenizer, no weights
    python benchmarks/gpu_model.py materialize benchmarks/gpu-model  # there: random weights, seed 0

The bundled GGUF file (94 MiB) is larger than what a device run may carry, and the device
machine has neither the package nor the network. `prepare` writes SmolLM2's config and
tokenizer (read from the GGUF file, 3.5 MB) to a folder; `materialize` fills it with random
weights of that config, so `headscope analyze FOLDER` runs the same shapes, kernels and
lengths. Times and memory depend on shapes only, and the agreement checks hold for any
weights; the scores and labels of such a run mean nothing, and its results say so
(`random-weights.txt` in the folder).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTE = "random-weights.txt"


def prepare(folder: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from headscope.loading.gguf_file import config_and_tokenizer
    from headscope.loading.loader import ALIASES

    path = ALIASES["smollm2-135m"].location()
    if path is None:
        raise SystemExit(f"smollm2-135m is not installed: {ALIASES['smollm2-135m'].install_command}")
    config, tokenizer = config_and_tokenizer(str(path.parent), path.name)
    folder.mkdir(parents=True, exist_ok=True)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / NOTE).write_text("SmolLM2-135M's config and tokenizer with random weights (seed 0): shapes, times and "
                               "memory as the real model's; its scores and labels mean nothing.\n")


def materialize(folder: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if (folder / "model.safetensors").exists():
        return
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    model.save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["prepare", "materialize"])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    (prepare if args.action == "prepare" else materialize)(args.folder)


if __name__ == "__main__":
    main()
