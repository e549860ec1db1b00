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


def _encoder_decoder(start=START, sites=None):
    config = SimpleNamespace(decoder_start_token_id=start)
    return SimpleNamespace(tokenizer=char_tokenizer(), model=SimpleNamespace(config=config), name="tiny-seq2seq",
                           sites=sites, two_inputs=sites is not None)


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


def test_the_explorer_batch_is_the_first_examples_both_inputs_cut_short():
    built = CopyProbe(n_examples=5, seq_len=24).build(_encoder_decoder(), seed=0)
    batch = built.explorer_batch(2, 10)
    assert torch.equal(batch.input_ids, built.input_ids[:2, :10])
    assert torch.equal(batch.decoder_input_ids, built.decoder_input_ids[:2, :10])
    assert batch.attention_mask.all() and batch.decoder_attention_mask.all()
    assert (batch.content_start, batch.decoder_content_start) == (built.content_start, built.content_start + 1)
    cross = batch.for_site("cross")  # the explorer's axes: decoder tokens as queries, encoder tokens as keys
    assert torch.equal(cross.input_ids, batch.decoder_input_ids) and torch.equal(cross.key_ids, batch.input_ids)


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
    with pytest.raises(headscope.HeadscopeError, match="has no decoder_start_token_id"):
        CopyProbe(2, 16).eval_probe(_encoder_decoder(start=None, sites="decoder.cross"), 2, seed=0)


def test_the_copy_probes_causal_check_scores_the_decoder_on_the_copied_tokens():
    loaded = _encoder_decoder(sites="decoder.cross")
    built = CopyProbe(n_examples=3, seq_len=20).build(loaded, seed=1)
    probe = CopyProbe(n_examples=16, seq_len=20).eval_probe(loaded, 3, seed=1)  # n_examples: the argument's
    assert probe.name == "copy" and probe.two_inputs
    assert torch.equal(probe.input_ids, built.input_ids) and torch.equal(probe.decoder_input_ids, built.decoder_input_ids)
    assert torch.equal(probe.targets, built.input_ids)  # decoder position t predicts encoder token t
    text = TextProbe(3, 20).eval_probe(loaded, 3, seed=1)
    assert torch.equal(probe.scored, text.scored) and bool(probe.attention_mask.all())
    assert "teacher-forced copy" in probe.description
    with pytest.raises(headscope.HeadscopeError, match="copy probe's causal check is the decoder's copy loss") as err:
        CopyProbe(2, 16).eval_probe(_encoder_decoder(), 2, seed=0)
    assert "\n" not in str(err.value)


def test_a_padded_causal_check_cannot_be_a_copy():
    from headscope.errors import CannotScore
    from headscope.probes.base import EvalProbe
    from headscope.probes.copy import as_copy_eval

    ids = torch.arange(12).view(2, 6)
    mask = torch.ones(2, 6, dtype=torch.bool)
    probe = EvalProbe("text", ids, ids, mask, mask, "six tokens")
    copy = as_copy_eval(probe, START)
    assert torch.equal(copy.decoder_input_ids, torch.tensor([[2, 0, 1, 2, 3, 4], [2, 6, 7, 8, 9, 10]]))
    assert as_copy_eval(copy, START) is copy
    mask[1, 4:] = False
    with pytest.raises(CannotScore, match="text probe cannot feed an encoder-decoder's decoder"):
        as_copy_eval(EvalProbe("text", ids, ids, mask, mask, "padded"), START)


def test_todays_probes_build_self_attention_batches_as_before():
    loaded = SimpleNamespace(tokenizer=char_tokenizer())
    for batch in TextProbe(3, 16).build(loaded, seed=0).batches(2, True, "cpu"):
        assert batch.site_kind == "causal" and batch.key_ids is None and batch.key_mask is None
