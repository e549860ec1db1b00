"""The copy probe of encoder-decoders: the encoder reads the text probe's windows, the decoder the
same tokens shifted right behind its start token (transformers' own `shift_tokens_right`), and
each batch gives the `ProbeBatch` of every site kind."""
from types import SimpleNamespace

import pytest
import torch

import headscope
from headscope.probes.base import text_probe
from headscope.probes.copy import Seq2SeqBatch
from headscope.probes.kinds import PROBE_KINDS, CopyProbe, TextProbe
from tests.support.planted import char_tokenizer

START = 2  # the char tokenizer's [BOS], standing in for BART's </s> or T5's pad


def _encoder_decoder(start=START):
    config = SimpleNamespace(decoder_start_token_id=start)
    return SimpleNamespace(tokenizer=char_tokenizer(), model=SimpleNamespace(config=config), name="tiny-seq2seq")


def test_the_decoder_reads_the_encoders_tokens_shifted_right():
    from transformers.models.bart.modeling_bart import shift_tokens_right

    loaded = _encoder_decoder()
    built = CopyProbe(n_examples=4, seq_len=32).build(loaded, seed=3)
    assert PROBE_KINDS["copy"] is CopyProbe and built.name == "copy"
    assert torch.equal(built.input_ids, text_probe(loaded.tokenizer, 4, 32, seed=3).input_ids)  # the text probe's
    assert torch.equal(built.decoder_input_ids, shift_tokens_right(built.input_ids, 0, START))
    # decoder position i holds encoder token i - 1 (and is trained to predict encoder token i)
    assert torch.equal(built.decoder_input_ids[:, 1:], built.input_ids[:, :-1])
    assert built.meta()["seq_len"] == 32 and len(built) == 4


def test_each_site_kind_reads_its_own_batch():
    built = CopyProbe(n_examples=5, seq_len=24).build(_encoder_decoder(), seed=0)
    batches = built.batches(2, True, "cpu")
    assert [b.input_ids.shape[0] for b in batches] == [2, 2, 1]
    batch = batches[0]
    assert isinstance(batch, Seq2SeqBatch)
    encoder, decoder, cross = (batch.for_site(kind) for kind in ("bidirectional", "causal", "cross"))
    assert encoder.site_kind == "bidirectional" and torch.equal(encoder.input_ids, built.input_ids[:2])
    assert decoder.site_kind == "causal" and torch.equal(decoder.input_ids, built.decoder_input_ids[:2])
    assert decoder.content_start == encoder.content_start + 1  # the decoder is one token behind
    assert cross.site_kind == "cross"
    assert torch.equal(cross.input_ids, built.decoder_input_ids[:2]) and torch.equal(cross.key_ids, built.input_ids[:2])
    assert cross.key_allowed().shape == (2, 24, 24) and bool(cross.key_allowed().all())  # no causal triangle
    assert batch.for_site("cross") is cross  # made once: its masks are shared across layers
    moved = batch.to("cpu")
    assert torch.equal(moved.for_site("cross").key_mask, cross.key_mask)
    with pytest.raises(headscope.HeadscopeError, match="unknown site kind"):
        batch.for_site("encoder")


def test_a_model_without_a_decoder_start_token_is_refused():
    with pytest.raises(headscope.HeadscopeError, match="has no decoder_start_token_id"):
        CopyProbe(2, 16).build(_encoder_decoder(start=None), seed=0)
    with pytest.raises(headscope.HeadscopeError, match="no causal check"):
        CopyProbe(2, 16).eval_probe(_encoder_decoder(), 2, seed=0)


def test_todays_probes_build_self_attention_batches_as_before():
    loaded = SimpleNamespace(tokenizer=char_tokenizer())
    for batch in TextProbe(3, 16).build(loaded, seed=0).batches(2, True, "cpu"):
        assert batch.site_kind == "causal" and batch.key_ids is None and batch.key_mask is None
