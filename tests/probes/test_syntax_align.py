"""Word alignment (headscope.probes.align) on WordPiece, byte-level BPE and Metaspace tokenizers."""
from pathlib import Path

import pytest

from headscope.errors import HeadscopeError
from headscope.probes.align import align_words
from headscope.probes.align import word_spans
from headscope.probes.conllu import Sentence, bundled_treebank, read_conllu

# "Unbelievably, the re-tokenized bookshop opened (again)." -- split words and punctuation
# glued to their neighbours (SpaceAfter=No).
WORDS = ("Unbelievably", ",", "the", "re-tokenized", "bookshop", "opened", "(", "again", ")", ".")
SPACE = (False, True, True, True, True, True, False, False, False, False)
SENTENCE = Sentence("t1", WORDS, (6, 6, 5, 5, 6, 0, 8, 6, 8, 6),
                    ("advmod", "punct", "det", "amod", "nsubj", "root", "punct", "obl", "punct", "punct"), SPACE)


def _train(kind: str, **options):
    """A small tokenizer trained on 300 grammar sentences (tools/grammar), wrapped for transformers."""
    from tokenizers import ByteLevelBPETokenizer, SentencePieceBPETokenizer
    from transformers import PreTrainedTokenizerFast

    cls = ByteLevelBPETokenizer if kind == "byte-level" else SentencePieceBPETokenizer
    trained = cls(**options)
    grammar = read_conllu(Path(__file__).resolve().parents[2] / "tools" / "grammar" / "generated.conllu")
    trained.train_from_iterator([s.text for s in grammar[:300]], vocab_size=400, min_frequency=2,
                                show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=trained._tokenizer)


def _check_alignment(tokenizer, sentence):
    """Special tokens map to -1; a token belongs to the word holding its first non-space
    character (or, if all space, to the next word); a word owns no token only when a token that
    starts in an earlier word covers it."""
    alignment = align_words(tokenizer, sentence)
    encoding = tokenizer(sentence.text, return_offsets_mapping=True, return_special_tokens_mask=True)
    assert list(alignment.input_ids) == encoding["input_ids"]
    spans, text = word_spans(sentence), sentence.text
    covered = set()
    for word, (start, end), special in zip(alignment.token_words, encoding["offset_mapping"],
                                           encoding["special_tokens_mask"]):
        if special:
            assert word == -1
            continue
        word_start, word_end = spans[word]
        piece = text[start:end].lstrip()  # byte-level / Metaspace offsets may include the space
        if piece:
            first = end - len(piece)
            assert word_start <= first < word_end, (text[start:end], sentence.words[word])
            covered.update(w for w, (a, b) in enumerate(spans) if a < end and b > first)
        else:  # a lone space token goes to the word after it
            assert word_start >= start
    assert covered | set(alignment.token_words) >= set(range(len(spans)))
    return alignment


def _pieces(tokenizer, alignment, word):
    tokens = tokenizer.convert_ids_to_tokens(list(alignment.input_ids))
    return [t for t, w in zip(tokens, alignment.token_words) if w == word]


def test_word_spans_match_text():
    text = SENTENCE.text
    assert text == "Unbelievably, the re-tokenized bookshop opened (again)."
    assert [text[a:b] for a, b in word_spans(SENTENCE)] == list(WORDS)


@pytest.mark.parametrize("options", [{}, {"trim_offsets": True}], ids=["offsets-with-space", "trimmed"])
def test_byte_level_bpe(options):
    tokenizer = _train("byte-level", **options)
    alignment = _check_alignment(tokenizer, SENTENCE)
    assert all(alignment.aligned)
    assert all(w >= 0 for w in alignment.token_words)  # no special tokens added
    assert len(_pieces(tokenizer, alignment, 3)) >= 3  # "re-tokenized": several pieces
    assert _pieces(tokenizer, alignment, 4)[0].startswith("Ġ")  # the space travels with the word
    for sentence in bundled_treebank()[::40]:
        _check_alignment(tokenizer, sentence)


def test_metaspace_sentencepiece():
    # Metaspace splits on spaces only, so a piece can run from a word into the punctuation
    # glued to it ("ly," here): the comma then owns no token and its arcs are not scored.
    tokenizer = _train("metaspace")
    alignment = _check_alignment(tokenizer, SENTENCE)
    assert _pieces(tokenizer, alignment, 0)[-1] == "ly," and not alignment.aligned[1]
    assert _pieces(tokenizer, alignment, 2)[0].startswith("▁")
    assert len(_pieces(tokenizer, alignment, 4)) >= 2
    for sentence in bundled_treebank()[::40]:
        _check_alignment(tokenizer, sentence)


def test_lone_space_token_goes_to_next_word():
    from tests.support.planted import char_tokenizer

    tokenizer = char_tokenizer()
    alignment = align_words(tokenizer, SENTENCE)
    # one token per character: "Unbelievably" (12), "," (1), then " " joins "the"
    assert alignment.token_words[:14] == (0,) * 12 + (1, 2)


@pytest.mark.slow
def test_wordpiece_minilm(minilm):
    tokenizer = minilm.tokenizer
    alignment = _check_alignment(tokenizer, SENTENCE)
    assert all(alignment.aligned)
    tokens = tokenizer.convert_ids_to_tokens(list(alignment.input_ids))
    assert (tokens[0], tokens[-1]) == ("[CLS]", "[SEP]")
    assert alignment.token_words[0] == alignment.token_words[-1] == -1
    assert _pieces(tokenizer, alignment, 4) == ["books", "##hop"]
    assert _pieces(tokenizer, alignment, 3) == ["re", "-", "token", "##ized"]
    assert _pieces(tokenizer, alignment, 6) == ["("]
    for sentence in bundled_treebank():
        assert all(_check_alignment(tokenizer, sentence).aligned)


@pytest.mark.slow
def test_smollm2_gguf_tokenizer(smollm2):
    # The GGUF-converted SmolLM2 tokenizer is byte-level BPE ("Ġ" pieces, offsets that include
    # the leading space) and adds no special tokens.
    # Here ")." is one token, so the final "." owns none. In the bundled treebank this happens
    # only to punctuation glued to the punctuation before it (',"', '?"', ").", ...): punctuation,
    # whose arcs are never scored.
    tokenizer = smollm2.tokenizer
    alignment = _check_alignment(tokenizer, SENTENCE)
    assert all(w >= 0 for w in alignment.token_words)
    assert _pieces(tokenizer, alignment, 4) == ["Ġbooks", "hop"]
    assert _pieces(tokenizer, alignment, 6) == ["Ġ("]
    assert _pieces(tokenizer, alignment, 8) == [")."] and alignment.aligned == (True,) * 9 + (False,)
    glued = []
    for sentence in bundled_treebank():
        aligned = _check_alignment(tokenizer, sentence).aligned
        unaligned = [i for i, ok in enumerate(aligned) if not ok]
        assert all(sentence.relations[i] == "punct" and sentence.upos[i - 1] == "PUNCT" for i in unaligned), \
            sentence.sent_id
        glued += [sentence.words[i - 1] + sentence.words[i] for i in unaligned]
    assert 0 < len(glued) <= 30, glued  # 20 of 16,390 words: ',"' '?"' '".' ').' '.)' ...


def test_word_inside_another_words_token_is_unaligned():
    # "cannot" is two treebank words ("can" + "not", SpaceAfter=No) but one character token each
    # here -- use a tokenizer that keeps "cannot" whole: a WordLevel vocabulary with that word.
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({"[UNK]": 0, "I": 1, "cannot": 2, "go": 3}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")
    sentence = Sentence("c", ("I", "can", "not", "go"), (4, 4, 4, 0), ("nsubj", "aux", "advmod", "root"),
                        (True, False, True, False))
    alignment = align_words(tokenizer, sentence)
    assert alignment.token_words == (0, 1, 3)
    assert alignment.aligned == (True, True, False, True)


def test_slow_tokenizer_is_refused():
    class NoOffsets:
        is_fast = False

    with pytest.raises(HeadscopeError, match="fast tokenizer"):
        align_words(NoOffsets(), SENTENCE)


@pytest.mark.parametrize("kind", ["byte-level", "metaspace"])
def test_a_batch_of_sentences_aligns_as_one_at_a_time(kind):
    """`align_sentences` tokenizes a treebank in one call and gives each sentence's own alignment."""
    from headscope.probes.align import align_sentences

    tokenizer = _train(kind)
    sentences = bundled_treebank()[:200] + [SENTENCE]
    assert align_sentences(tokenizer, sentences) == [align_words(tokenizer, s) for s in sentences]
    assert align_sentences(tokenizer, []) == []
