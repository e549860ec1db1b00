"""Word alignment: which treebank word each sub-word token belongs to.

Offers:
    Alignment     -- a sentence's token ids with, per token, the index of its word or -1.
    align_words   -- tokenize ``Sentence.text`` and map every token to a word through the
                     tokenizer's character offsets.
    align_sentences -- the same for many sentences, tokenized in one batch call.
    word_spans    -- each word's character span in ``Sentence.text``.

Rules (the same for every tokenizer family):
    * special tokens ([CLS], [SEP], BOS, ...) belong to no word (-1);
    * a token belongs to the first word whose characters it covers; offsets that include the
      leading space (byte-level BPE "Ġthe", Metaspace "▁the") are handled because spaces
      belong to no word;
    * a token that covers only whitespace (a lone "Ġ" or "▁", offsets trimmed to empty or
      not) belongs to the next word, since these tokenizers attach a space to the word after it;
    * a word whose characters all sit inside a token that starts in an earlier word (one
      token spelling two treebank words, "cannot" = "can" + "not") gets no token; its arcs
      cannot be scored and ``Alignment.aligned`` marks it.

Needs a fast (Rust) tokenizer, the only kind that reports offsets.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from headscope.errors import HeadscopeError

__all__ = ["Alignment", "align_words", "align_sentences", "word_spans"]


@dataclass(frozen=True)
class Alignment:
    """One sentence as the model sees it.

    Attributes:
        input_ids: token ids, with the tokenizer's special tokens.
        token_words: per token, the 0-based index of its word, or -1 (special token).
        n_words: number of words in the sentence.
    """

    input_ids: tuple[int, ...]
    token_words: tuple[int, ...]
    n_words: int

    @property
    def aligned(self) -> tuple[bool, ...]:
        """Per word, whether at least one token belongs to it."""
        owned = set(self.token_words)
        return tuple(word in owned for word in range(self.n_words))

    def with_prefix(self, token_ids: list[int]) -> "Alignment":
        """The same alignment after extra special tokens (a BOS) put in front."""
        return Alignment(tuple(token_ids) + self.input_ids, (-1,) * len(token_ids) + self.token_words,
                         self.n_words)


def word_spans(sentence) -> list[tuple[int, int]]:
    """Character span ``[start, end)`` of each word in ``sentence.text``.

    Args:
        sentence: a ``headscope.probes.conllu.Sentence``.
    Returns:
        One ``(start, end)`` per word, from ``words`` and ``space_after`` (one space after a
        word unless ``space_after`` is False), matching ``Sentence.text``.
    """
    spans, position = [], 0
    for word, space in zip(sentence.words, sentence.space_after):
        spans.append((position, position + len(word)))
        position += len(word) + (1 if space else 0)
    return spans


def align_words(tokenizer, sentence, add_special_tokens: bool = True) -> Alignment:
    """Tokenize a sentence and map each token to its word.

    Args:
        tokenizer: a fast Hugging Face tokenizer (WordPiece, byte-level BPE, SentencePiece /
            Metaspace, including the GGUF-converted ones).
        sentence: a ``headscope.probes.conllu.Sentence``; its ``text`` is what gets tokenized.
        add_special_tokens: wrap the text in the tokenizer's own special tokens ([CLS] ...
            [SEP] for BERT; none for SmolLM2).
    Returns:
        An ``Alignment``; ``token_words[t]`` is the word of token ``t`` or -1.
    Raises:
        HeadscopeError: the tokenizer reports no offsets (a slow, Python tokenizer).
    """
    return align_sentences(tokenizer, [sentence], add_special_tokens)[0]


def align_sentences(tokenizer, sentences, add_special_tokens: bool = True) -> list[Alignment]:
    """`align_words` of each sentence, the texts tokenized in one batch call (the same tokens as
    one call per sentence; far less time per sentence on a treebank).

    Raises:
        HeadscopeError: the tokenizer reports no offsets (a slow, Python tokenizer).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise HeadscopeError(
            f"word alignment needs a fast tokenizer with character offsets; {type(tokenizer).__name__} is not one"
        )
    if not sentences:
        return []
    encoding = tokenizer([sentence.text for sentence in sentences], add_special_tokens=add_special_tokens,
                         return_offsets_mapping=True, return_special_tokens_mask=True, verbose=False)
    return [_alignment(sentence, ids, offsets, special) for sentence, ids, offsets, special in
            zip(sentences, encoding["input_ids"], encoding["offset_mapping"], encoding["special_tokens_mask"])]


def _alignment(sentence, input_ids, offsets, special_mask) -> Alignment:
    """One sentence's `Alignment` from its token ids, character offsets and special-token mask."""
    text = sentence.text
    spans = word_spans(sentence)
    word_of_char = [-1] * len(text)  # spaces stay -1
    for index, (start, end) in enumerate(spans):
        word_of_char[start:end] = [index] * (end - start)
    starts = [start for start, _ in spans]

    token_words = []
    for (start, end), special in zip(offsets, special_mask):
        if special:
            token_words.append(-1)
            continue
        covered = [w for w in word_of_char[start:end] if w >= 0]
        if covered:
            token_words.append(covered[0])
        else:  # whitespace-only or empty offsets: the space belongs to the next word
            following = bisect_left(starts, start)
            token_words.append(following if following < len(spans) else -1)
    return Alignment(tuple(input_ids), tuple(token_words), len(spans))
