"""A GGUF file turned into a transformers model with one pass over its metadata.

transformers' own GGUF loading decodes every metadata field (the 49k-entry vocabulary
included) once for each of config, model config, tokenizer and weights, and rebuilds gguf's
tensor name table once per submodule. Here:

- the config comes from transformers (`AutoConfig`, the one full decode of the metadata);
- the tokenizer from its tokenizer class, which reads only the vocabulary and merges;
- the weights from `gguf_state_dict`: a walk over the file that skips metadata values to find
  the tensor table, each tensor read into a buffer of its own, gguf's own dequantisation (its
  array becomes the tensor, uncopied), transformers' per-architecture tensor processor (e.g.
  Llama's q/k row permutation), and one name table for the whole model;
- the model from `from_pretrained(None, state_dict=...)`, which builds it on the meta device and
  takes those tensors as its parameters: the weights exist once (tested).

The result equals transformers' `from_pretrained(..., gguf_file=...)` tensor for tensor
(tested); `headscope.loading.load_cache` stores it so later loads skip all of this.

- `config_and_tokenizer(folder, file_name)`: transformers config and tokenizer of a GGUF file.
- `model_from_gguf(path, config, model_class, dtype)`: the model with dequantised weights.
- `read_tensor_table(path)`: architecture, tensor entries and where the tensor data starts.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TensorEntry", "TensorTable", "read_tensor_table", "gguf_state_dict", "model_from_gguf",
           "config_and_tokenizer"]

# Fixed-width metadata value types of the GGUF format: type id -> struct format.
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_DEFAULT_ALIGNMENT = 32  # the format's default when `general.alignment` is absent


@dataclass(frozen=True)
class TensorEntry:
    name: str  # GGUF name, e.g. "blk.0.attn_q.weight"
    dims: tuple[int, ...]  # as ggml writes them: fastest-moving first
    ggml_type: int
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class TensorTable:
    architecture: str  # `general.architecture`, e.g. "llama"
    tensors: tuple[TensorEntry, ...]
    data_start: int  # byte offset of the data section in the file


class _Cursor:
    """Reads little-endian GGUF values from a buffer, advancing a position."""

    def __init__(self, buffer, path: Path):
        self.buffer, self.pos, self.path = buffer, 0, path

    def unpack(self, fmt: str):
        values = struct.unpack_from(fmt, self.buffer, self.pos)
        self.pos += struct.calcsize(fmt)
        return values if len(values) > 1 else values[0]

    def string(self) -> str:
        length = self.unpack("<Q")
        start, self.pos = self.pos, self.pos + length
        return bytes(self.buffer[start:self.pos]).decode("utf-8")

    def value(self, value_type: int, keep: bool):
        """One metadata value; with keep=False strings and arrays are skipped (None)."""
        if value_type in _SCALAR:
            return self.unpack(_SCALAR[value_type])
        if value_type == _STRING:
            if keep:
                return self.string()
            length = self.unpack("<Q")
            self.pos += length
            return None
        if value_type == _ARRAY:
            element_type, count = self.unpack("<IQ")
            if element_type in _SCALAR:  # fixed width: jump over it in one step
                width = struct.calcsize(_SCALAR[element_type])
                self.pos += count * width
            else:
                for _ in range(count):
                    self.value(element_type, keep=False)
            return None
        raise ValueError(f"{self.path.name}: unknown GGUF metadata type {value_type}")


def read_tensor_table(path) -> TensorTable:
    """The tensor table of a GGUF file (v2 or v3) without decoding its vocabulary.

    Only `general.architecture` and `general.alignment` are kept from the metadata; the other
    values are stepped over (a 49k-string vocabulary costs ~50 ms this way).
    """
    path = Path(path)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
        cursor = _Cursor(buffer, path)
        magic, version = cursor.unpack("<4sI")
        if magic != b"GGUF" or version not in (2, 3):
            raise ValueError(f"{path.name} is not a GGUF v2/v3 file")
        n_tensors, n_fields = cursor.unpack("<QQ")
        wanted = {"general.architecture": None, "general.alignment": _DEFAULT_ALIGNMENT}
        for _ in range(n_fields):
            key = cursor.string()
            value = cursor.value(cursor.unpack("<I"), keep=key in wanted)
            if key in wanted:
                wanted[key] = value
        tensors = []
        for _ in range(n_tensors):
            name = cursor.string()
            n_dims = cursor.unpack("<I")
            dims = struct.unpack_from(f"<{n_dims}Q", buffer, cursor.pos)
            cursor.pos += 8 * n_dims
            ggml_type, offset = cursor.unpack("<IQ")
            tensors.append(TensorEntry(name, tuple(dims), ggml_type, offset))
        alignment = wanted["general.alignment"]
        data_start = -(-cursor.pos // alignment) * alignment  # next multiple of the alignment
    if wanted["general.architecture"] is None:
        raise ValueError(f"{path.name} has no general.architecture")
    return TensorTable(wanted["general.architecture"], tuple(tensors), data_start)


def _raw_array(fh, table: TensorTable, entry: TensorEntry):
    """The tensor's stored values as numpy, shaped as gguf's dequantize expects, read from the
    open file `fh` into a buffer of their own (not a mapping of the file, whose pages would stay
    in the resident set until it is closed: the whole file beside the weights).

    Plain float types come as their own dtype in torch order; block-quantised types as uint8
    rows of whole blocks (the last dimension in bytes).
    """
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quant_shape_to_byte_shape

    shape = tuple(reversed(entry.dims))  # torch order: slowest-moving first
    plain = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
    qtype = GGMLQuantizationType(entry.ggml_type)
    if qtype in plain:
        dtype, stored_shape = np.dtype(plain[qtype]), shape
    elif qtype in GGML_QUANT_SIZES:
        dtype, stored_shape = np.dtype(np.uint8), quant_shape_to_byte_shape(shape, qtype)
    else:
        raise ValueError(f"tensor {entry.name}: unsupported ggml type {qtype.name}")
    buffer = bytearray(int(np.prod(stored_shape, dtype=np.int64)) * dtype.itemsize)
    fh.seek(table.data_start + entry.offset)
    if fh.readinto(buffer) != len(buffer):
        raise ValueError(f"tensor {entry.name} runs past the end of the file")
    return np.frombuffer(buffer, dtype=dtype).reshape(stored_shape)


def _name_map(architecture: str, model, processor) -> dict[str, str]:
    """GGUF tensor name -> transformers state-dict key, from one gguf name table.

    Every module (outermost first, in module order) tries to name its own state-dict keys,
    and the first module to claim a GGUF name keeps it: the order of transformers' recursive
    search, without rebuilding the name table for each of the ~400 modules.
    """
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((a for a, name in MODEL_ARCH_NAMES.items() if name == architecture), None)
    if arch is None:
        raise ValueError(f"gguf does not know the architecture {architecture!r}")
    table = get_tensor_name_map(arch, model.config.num_hidden_layers)
    keys = list(model.state_dict().keys())
    mapping: dict[str, str] = {}
    for module_name, _ in model.named_modules(remove_duplicate=False):
        prefix = module_name + "." if module_name else ""
        level: dict[str, str] = {}
        for key in keys:
            if not key.startswith(prefix):
                continue
            local = processor.preprocess_name(key[len(prefix):])
            stem, suffix = local, ""
            if local.endswith((".weight", ".bias")):
                stem, suffix = local.rsplit(".", 1)
                suffix = "." + suffix
            gguf_name = table.get_name(stem)
            if gguf_name is None:
                processor.perform_fallback_tensor_mapping(level, suffix, prefix, local)
            else:
                level[gguf_name + suffix] = prefix + local
        for gguf_name, key in level.items():
            mapping.setdefault(gguf_name, key)
    return mapping


def gguf_state_dict(path, model, dtype=None) -> dict:
    """The file's tensors, dequantised, under the state-dict keys of `model` (may be on meta).

    Args:
        path: the .gguf file.
        model: a transformers model of the file's config; only its names and config are read.
        dtype: torch dtype to cast each tensor to after dequantising (default: float32).
    Returns:
        {state-dict key: CPU tensor}; GGUF tensors the model has no key for are left out.
    """
    from gguf import GGMLQuantizationType, dequantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    table = read_tensor_table(path)
    config = model.config.to_dict()
    processor = TENSOR_PROCESSORS.get(table.architecture, TensorProcessor)(config=config)
    names = _name_map(table.architecture, model, processor)
    out = {"tensors": {}}  # the processors of MoE models write merged experts in here
    with open(path, "rb") as fh:
        for entry in table.tensors:
            raw = _raw_array(fh, table, entry)
            weights = dequantize(raw, GGMLQuantizationType(entry.ggml_type))
            result = processor.process(weights=weights, name=entry.name, tensor_key_mapping=names,
                                       parsed_parameters=out)
            if result.name not in names:
                continue
            out["tensors"][names[result.name]] = _owned_tensor(result.weights, dtype)
            del raw, weights, result
    return out["tensors"]


def _owned_tensor(weights, dtype):
    """A CPU tensor of `weights`, cast to `dtype` (None: as it is). The array's memory is taken
    as it is (it was read into a buffer of its own, or decoded into a new array), so a large
    tensor never exists twice; only a read-only or non-contiguous array is copied."""
    import numpy as np
    import torch

    if not weights.flags.c_contiguous or not weights.flags.writeable:
        weights = np.array(weights, copy=True, order="C")
    tensor = torch.from_numpy(weights)
    return tensor if dtype is None or tensor.dtype == dtype else tensor.to(dtype)


def model_from_gguf(path, config, model_class, dtype=None, **placement):
    """A `model_class` model of `config` holding the GGUF file's dequantised weights.

    `placement` (device_map, max_memory, offload_folder) goes to `from_pretrained`; without it
    the model is on CPU.
    """
    import torch

    with torch.device("meta"):
        skeleton = model_class.from_config(config)
    state_dict = gguf_state_dict(path, skeleton, dtype)
    concrete = type(skeleton)  # an Auto class resolves to this; from_pretrained(None) needs it
    del skeleton
    kwargs = {"dtype": dtype} if dtype is not None else {}
    return concrete.from_pretrained(None, config=config, state_dict=state_dict, **kwargs, **placement)


def config_and_tokenizer(folder: str, file_name: str) -> tuple[Any, Any]:
    """The transformers config and tokenizer of `folder/file_name`, as `AutoConfig` and
    `AutoTokenizer` build them, decoding the metadata once instead of three times."""
    from transformers import AutoConfig, TokenizersBackend
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

    config = AutoConfig.from_pretrained(folder, gguf_file=file_name, local_files_only=True)
    # AutoTokenizer decodes the metadata again just to learn this class from the config.
    class_name = TOKENIZER_MAPPING_NAMES.get(config.model_type)
    tokenizer_class = (tokenizer_class_from_name(class_name) if class_name else None) or TokenizersBackend
    tokenizer = tokenizer_class.from_pretrained(folder, gguf_file=file_name, local_files_only=True)
    return config, tokenizer
