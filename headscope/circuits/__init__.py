"""How heads work together: tasks, attribution and circuits.

- `Task`, `task(name_or_path, tokenizer, n=..., seed=...)` (`headscope.circuits.tasks`,
  `headscope.circuits.task_builders`): clean and corrupted prompts with their answers and a
  metric; `tokenizer_fingerprint(tokenizer)`.

The package sits beside `causal/`: it runs models through `hf/` and reads `loading/`; the report
and the CLI sit above it.
"""
from .task_builders import BUILTINS, task
from .tasks import METRICS, Task, tokenizer_fingerprint

__all__ = ["Task", "task", "tokenizer_fingerprint", "METRICS", "BUILTINS"]
