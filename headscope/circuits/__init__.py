"""How heads work together: tasks, attribution and circuits.

- `Task`, `task(name_or_path, tokenizer, n=..., seed=...)` (`headscope.circuits.tasks`): clean and
  corrupted prompts with their answers and a metric.

The package sits beside `causal/`: it runs models through `hf/` and reads `loading/`; the report
and the CLI sit above it.
"""
