"""Small real word-level tokenizers (`tokenizers` + `PreTrainedTokenizerFast`, no network).

- `word_tokenizer(words, bos=True, eos=False, digits=None)`: one token per word and per
  punctuation mark, ids in the order given after [PAD] 0, [UNK] 1, [BOS] 2, [EOS] 3. `bos` puts
  [BOS] before every encoded text (as Llama's tokenizer does), `eos` [EOS] after it (as BERT's
  [SEP]). `digits="pairs"` splits numbers into two-digit tokens (" 1732" -> "17", "32", as
  GPT-2 does years), `digits="single"` into single digits (as SmolLM2 does).
- `ioi_tokenizer(bos=True, eos=False)`: the IOI templates' words, `IOI_NAMES`, `IOI_PLACES` and
  `IOI_OBJECTS`: under 99 tokens, so its tasks run on the tiny models of `tiny.py` (vocab 99).
- `year_tokenizer(digits)`: the greater-than template's words and the numbers 00..99 (pairs) or
  0..9 (single).
- `byte_level_tokenizer(words)`: GPT-2's layout (byte-level pre-tokenizer, a word after a space is
  'Ġword'), each word and punctuation mark a token with and without its leading space: 'Mary'
  and ' Mary' are two tokens, as in GPT-2's vocabulary.
- `sentencepiece_tokenizer(words)`: a BPE over characters laid out as Llama 2's tokenizer.json
  (normalizer: prepend '▁', spaces to '▁'; no pre-tokenizer; [BOS] first), with a merge chain
  making each '▁word' one token. Like Llama 2's, it encodes a text that starts with a space as
  a lone '▁' and the word (' Mary' -> ['▁', '▁Mary']), and 'and Mary' as ['▁and', '▁Mary'].
"""
import re

__all__ = ["word_tokenizer", "ioi_tokenizer", "year_tokenizer", "byte_level_tokenizer", "sentencepiece_tokenizer", "IOI_NAMES", "IOI_PLACES", "IOI_OBJECTS", "SPECIALS"]

SPECIALS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
IOI_NAMES = ["Mary", "John", "Alice", "Bob", "James", "Sarah", "David", "Emma", "Tom", "Kate"]
IOI_PLACES = ["store", "park", "school", "office"]
IOI_OBJECTS = ["drink", "book", "ring", "cake"]
WORD = re.compile(r"\{\w+\}|\w+|[^\w\s]")


def word_tokenizer(words, bos: bool = True, eos: bool = False, digits=None):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for word in words:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    steps = [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    if digits == "pairs":
        steps.append(pre_tokenizers.Split(Regex(r"\d\d"), behavior="isolated"))
    elif digits == "single":
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    single = " ".join((["[BOS]"] if bos else []) + ["$A"] + (["[EOS]"] if eos else []))
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=[("[BOS]", 2), ("[EOS]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]",
                                   eos_token="[EOS]")


def template_words(*templates) -> list[str]:
    """The words and punctuation of templates, placeholders ({A}) left out, in order of appearance."""
    seen = {}
    for template in templates:
        for word in WORD.findall(template):
            if not word.startswith("{"):
                seen.setdefault(word)
    return list(seen)


def ioi_tokenizer(bos: bool = True, eos: bool = False):
    from headscope.circuits.task_builders import IOI_TEMPLATES

    return word_tokenizer(template_words(*IOI_TEMPLATES) + IOI_NAMES + IOI_PLACES + IOI_OBJECTS, bos=bos, eos=eos)


def year_tokenizer(digits: str):
    from headscope.circuits.task_builders import GT_TEMPLATE, YEAR_NOUNS

    numbers = [f"{yy:02d}" for yy in range(100)] if digits == "pairs" else [str(d) for d in range(10)]
    return word_tokenizer(template_words(GT_TEMPLATE) + list(YEAR_NOUNS) + numbers, digits=digits)


def byte_level_tokenizer(words):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + ["\u010a", "\u0120"])}  # "Ċ": a line break, "Ġ": a space
    for word in words:
        for token in (word, "\u0120" + word):  # "Ġ": the space before a word
            vocab.setdefault(token, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]",
                                   eos_token="[EOS]")


def sentencepiece_tokenizer(words):
    from tokenizers import Tokenizer, models, normalizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "\u2581": 2, "\n": 3}
    for char in sorted({c for word in words for c in word}):
        vocab.setdefault(char, len(vocab))
    merges = []
    for word in words:
        piece = "\u2581"
        for char in word:
            if piece + char not in vocab:
                merges.append((piece, char))
                vocab[piece + char] = len(vocab)
            piece += char
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")

