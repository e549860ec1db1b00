"""KV-cache policies from head labels, the files compression tools read, and what a policy costs.

- `kv_policy(analysis, keep=0.25, rank_by="retrieval")` -> `KVPolicy` (`policy.py`): which
  key/value heads keep the full cache, the rest a sink and a recent window.
- `write_duo` / `read_duo`, `write_headkv` / `read_headkv`, `read_policy` (`formats.py`):
  DuoAttention's `full_attention_heads.tsv` + `config.json`, HeadKV's `{"layer-head": [scores]}`.
- `kv_evaluate(loaded, policy)` -> `KVEvaluation` (`evaluate.py`): needle accuracy, loss and KV
  bytes against the reverse ranking, random heads, all streaming and full attention; its page
  (`report.py`).
The policy and the formats need no torch; `kv_evaluate` is imported on first use.
"""
from .._lazy import lazy_exports

from .formats import read_duo, read_headkv, read_policy, write_duo, write_headkv
from .policy import KVPolicy, kv_policy

__all__ = ["KVPolicy", "kv_policy", "kv_evaluate", "KVEvaluation", "read_duo", "read_headkv", "read_policy",
           "write_duo", "write_headkv"]

__getattr__, __dir__ = lazy_exports(__name__, {"kv_evaluate": "evaluate", "KVEvaluation": "evaluate"})
