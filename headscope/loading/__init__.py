"""Models: loading them, the load cache, GGUF files and the untrained control twin.

- `loader`: `load(spec)`, `models()`, `Loaded` (a model, its tokenizer and what headscope
  reads of its config).
- `load_cache`: converted GGUF models kept on disk, keyed on the file and the versions.
- `gguf_file`: a GGUF file read into a transformers config, tokenizer and weights.
- `control`: the random-init twin every learned-behaviour label is checked against.
"""
