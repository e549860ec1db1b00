"""The built-in tasks on SmolLM2-135M: what the model does on them (not a timing).

IOI at n=64 for seeds 0, 1, 2 (mean logit difference, accuracy, and the same on the ABC-corrupted
prompts), IOI per template (seed 0), and induction and induction-keys (n=32, L=20). Writes
benchmarks/results-tasks-smollm2.json; docs/results.md quotes it.

    python benchmarks/tasks_smollm2.py
"""
import json
from pathlib import Path

import torch

import headscope
from headscope.atomic import write_text_atomic
from headscope.circuits.task_builders import IOI_TEMPLATES


def run(loaded, task):
    with torch.no_grad():
        clean = task.score(loaded.model(**task.inputs("clean")).logits)
        corrupted = task.score(loaded.model(**task.inputs("corrupted")).logits)
    return clean, corrupted


def summary(clean, corrupted):
    return {"n": len(clean), "mean": round(clean.mean().item(), 3), "accuracy": round((clean > 0).float().mean().item(), 3),
            "min": round(clean.min().item(), 3), "corrupted_mean": round(corrupted.mean().item(), 3),
            "corrupted_sd": round(corrupted.std().item(), 3)}


def main():
    loaded = headscope.load("smollm2-135m", device="cpu")
    results = {"model": "smollm2-135m", "ioi": {}, "ioi_by_template": {}}
    for seed in (0, 1, 2):
        task = headscope.task("ioi", loaded, n=64, seed=seed)
        clean, corrupted = run(loaded, task)
        results["ioi"][f"seed {seed}"] = summary(clean, corrupted)
        print("ioi", seed, results["ioi"][f"seed {seed}"], flush=True)
        if seed == 0:
            failures = [task.texts[i] | {"logit_diff": round(clean[i].item(), 3)} for i in range(task.n) if clean[i] <= 0]
            results["ioi_failures_seed_0"] = failures
            for template in IOI_TEMPLATES:
                rows = [i for i in range(task.n) if _fits(task.texts[i]["clean"], template)]
                if rows:
                    results["ioi_by_template"][template] = summary(clean[rows], corrupted[rows])
    for name in ("induction", "induction-keys"):
        results[name] = summary(*run(loaded, headscope.task(name, loaded, n=32, seed=0)))
        print(name, results[name], flush=True)
    out = Path(__file__).with_name("results-tasks-smollm2.json")
    write_text_atomic(out, json.dumps(results, indent=1))
    print(out)


def _fits(text: str, template: str) -> bool:
    """Whether `text` came from `template` (its fixed words, in order)."""
    import re

    pattern = re.escape(template)
    for slot in ("A", "B", "S", "PLACE", "OBJECT"):
        pattern = pattern.replace(re.escape("{" + slot + "}"), r"\w+")
    return re.fullmatch(pattern, text) is not None


if __name__ == "__main__":
    main()
