"""Tokens as people can read them: one display string per token id, never mojibake.

- `display_tokens(tokenizer, ids) -> list[str]`: each id decoded on its own; bytes that are not
  valid UTF-8 on their own are shown as `<0xE2>`-style escapes.
- `byte_escape(raw) -> str`: valid UTF-8 runs of `raw` as text, every other byte as `<0xNN>`.

Byte-level BPE (GPT-2, SmolLM2) splits a multi-byte character such as `✓` (E2 9C 93) over
several tokens; decoded alone, each gives U+FFFD, and a vocabulary shown raw gives its byte
alphabet (`Ġâ`). Such a token's bytes are recovered through the byte-level alphabet (GPT-2's
`bytes_to_unicode`) and the undecodable ones escaped: `Ġâ` -> ` <0xE2>`. SentencePiece
byte-fallback tokens are already named `<0xE2>` and are kept as they are.
"""
from __future__ import annotations

import functools
import re

__all__ = ["display_tokens", "byte_escape"]

_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")
_REPLACEMENT = "\ufffd"


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict:
    """GPT-2's byte-level alphabet, reversed: printable character -> the byte it stands for.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, ...)
    are mapped in order to U+0100 onwards (Radford et al. 2019, `bytes_to_unicode`).
    """
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def byte_escape(raw: bytes) -> str:
    """`raw` as text: its valid UTF-8 runs decoded, every other byte written `<0xNN>`.

    Args:
        raw: the bytes of one token.
    Returns:
        e.g. `b" \\xe2"` -> `" <0xE2>"`, `b"caf\\xc3\\xa9"` -> `"café"`.
    """
    parts, start = [], 0
    while start < len(raw):
        try:
            parts.append(raw[start:].decode("utf-8"))
            break
        except UnicodeDecodeError as err:
            bad_start, bad_end = start + err.start, start + err.end
            parts.append(raw[start:bad_start].decode("utf-8"))
            parts.extend(f"<0x{b:02X}>" for b in raw[bad_start:bad_end])
            start = bad_end
    return "".join(parts)


def _is_byte_level(tokenizer) -> bool:
    """Whether the tokenizer writes tokens in the byte-level alphabet (`Ġthe`)."""
    if hasattr(tokenizer, "byte_decoder"):  # transformers' slow GPT-2 tokenizer
        return True
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    parts = (getattr(backend, "decoder", None), getattr(backend, "pre_tokenizer", None))
    return any("ByteLevel" in repr(part) for part in parts if part is not None)


def display_tokens(tokenizer, ids) -> list[str]:
    """One display string per token id: the token decoded alone, undecodable bytes as `<0xNN>`.

    Args:
        tokenizer: a transformers tokenizer (fast or slow).
        ids: token ids (ints).
    Returns:
        Strings, as `tokenizer.decode([t])` gives them when that is valid text (`Ġword` shows as
        ` word`); for a byte-level token whose bytes are not valid UTF-8 alone, the valid part
        as text and each other byte as `<0xNN>`; a SentencePiece byte-fallback token as its own
        name (`<0xE2>`).
    """
    ids = [int(t) for t in ids]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    byte_level = _is_byte_level(tokenizer)
    decoder = _byte_decoder()
    shown = []
    for token_id, piece in zip(ids, pieces):
        text = tokenizer.decode([token_id])
        piece = piece if isinstance(piece, str) else ""
        if _BYTE_PIECE.fullmatch(piece):
            shown.append(piece)
        elif byte_level and piece and all(c in decoder for c in piece):
            shown.append(byte_escape(bytes(decoder[c] for c in piece)))
        elif _REPLACEMENT in text and piece:
            shown.append(piece)  # bytes unknown: the vocabulary's own name beats a replacement mark
        else:
            shown.append(text)
    return shown
