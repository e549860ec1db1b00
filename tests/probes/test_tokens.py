"""`headscope.probes.tokens.display_tokens`: tokens decoded alone, undecodable bytes as `<0xNN>`, on a
byte-level BPE trained here on text with multi-byte characters, a SentencePiece vocabulary with
byte fallback, and the planted model's char tokenizer."""
import pytest

from headscope.probes.tokens import byte_escape, display_tokens
from tests.support.planted import char_tokenizer

TEXT = ["café naïve ✓ 中文 — 😀 déjà vu", "The cat sat on the mat.", "crème brûlée ✓✓ 中国 😀😀"]


@pytest.fixture(scope="module")
def byte_level():
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    trained = ByteLevelBPETokenizer()
    # A tiny vocabulary: the rare multi-byte characters stay split into byte tokens.
    trained.train_from_iterator(TEXT * 3, vocab_size=280, min_frequency=2, show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=trained._tokenizer)


@pytest.mark.parametrize("raw, shown", [
    (b" \xe2", " <0xE2>"), (b"caf\xc3\xa9", "café"), (b"\x9c\x93", "<0x9C><0x93>"),
    (b"a\xe2\x9cb", "a<0xE2><0x9C>b"), (b"\xf0\x9f\x98\x80", "😀"), (b"", ""),
])
def test_byte_escape(raw, shown):
    assert byte_escape(raw) == shown


def test_byte_level_tokens_that_split_a_character_show_as_escapes(byte_level):
    ids = byte_level("crème ✓ 中 😀").input_ids
    shown = display_tokens(byte_level, ids)
    decoded = [byte_level.decode([t]) for t in ids]
    split = [i for i, text in enumerate(decoded) if "\ufffd" in text]
    assert split, "the test text must contain characters the vocabulary splits into bytes"
    for i, (text, display) in enumerate(zip(decoded, shown)):
        assert "\ufffd" not in display
        if i in split:
            assert "<0x" in display
        else:
            assert display == text  # valid tokens show exactly as decode gives them
    # Joining the escapes back into bytes gives the text again: nothing is lost or invented.
    joined = b"".join(_unescape(s) for s in shown)
    assert joined.decode("utf-8") == byte_level.decode(ids)


def test_escapes_name_the_bytes_of_a_character_never_seen_in_training(byte_level):
    ids = byte_level("€").input_ids  # E2 82 AC: no merge of these bytes was learned
    assert display_tokens(byte_level, ids) == ["<0xE2>", "<0x82>", "<0xAC>"]


def test_sentencepiece_byte_fallback_tokens_keep_their_names():
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "▁the": 1, "<0xE2>": 2, "<0x9C>": 3, "<0x93>": 4, "▁": 5}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    assert tokenizer.decode([2]) == "\ufffd"  # what the explorer showed before
    assert display_tokens(tokenizer, [1, 2, 3, 4]) == [tokenizer.decode([1]), "<0xE2>", "<0x9C>", "<0x93>"]


def test_char_tokenizer_tokens_are_unchanged():
    tokenizer = char_tokenizer()
    ids = tokenizer("ab c").input_ids
    assert display_tokens(tokenizer, ids) == [tokenizer.decode([t]) for t in ids]


def _unescape(shown: str) -> bytes:
    import re

    out = b""
    for part in re.split(r"(<0x[0-9A-F]{2}>)", shown):
        out += bytes([int(part[3:5], 16)]) if re.fullmatch(r"<0x[0-9A-F]{2}>", part) else part.encode("utf-8")
    return out
