"""`Task` and `task()`: validation, metrics against references written here, the built-ins'
structure on small real word-level tokenizers, JSONL files and saving."""
import json

import pytest
import torch

import headscope
from headscope import HeadscopeError, Task
from headscope.circuits.task_builders import GT_CENTURIES
from headscope.circuits.tasks import tokenizer_fingerprint
from tests.support.tiny import tiny_model
from tests.support.word_tokenizer import (IOI_NAMES, IOI_OBJECTS, IOI_PLACES, ioi_tokenizer, sentencepiece_tokenizer,
                                          template_words, word_tokenizer, year_tokenizer)
from headscope.circuits.task_builders import IOI_TEMPLATES


@pytest.fixture(scope="module")
def words():
    return ioi_tokenizer()


def small(**changes):
    """Three examples of five positions, the last one padded after three tokens; sets of answers."""
    fields = dict(clean=[[5, 6, 7, 8, 9], [5, 6, 7, 8, 9], [1, 2, 3, 0, 0]],
                  corrupted=[[5, 6, 4, 8, 9], [5, 4, 7, 8, 9], [1, 4, 3, 0, 0]],
                  answer=[[10, 11], [12, -1], [13, 14]], wrong=[[20, -1], [21, 22], [23, -1]],
                  attention_mask=[[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    fields.update(changes)
    return Task(**fields)


# --- Task ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    (dict(corrupted=[[5, 6, 7, 8], [5, 6, 7, 8], [1, 2, 3, 0]]), "corrupted has shape [3, 4], clean [3, 5]"),
    (dict(clean=torch.ones(3, 5)), "clean must hold integer token ids"),
    (dict(clean=[5, 6, 7]), "clean must be [n, pos]"),
    (dict(answer=[10, 11]), "answer has 2 rows, clean 3"),
    (dict(wrong=[20, -1, 23]), "wrong row 1 is a negative token id"),
    (dict(answer=[[10, 11], [12, -2], [13, 14]]), "answer row 1 holds an id below -1"),
    (dict(wrong=[[20, -1], [-1, -1], [23, -1]]), "wrong row 1 is an empty set"),
    (dict(corrupted=[[5, 6, 7, 8, 9], [5, 6, 7, 8, 9], [1, -4, 3, 0, 0]]), "corrupted row 2 holds a negative token id"),
    (dict(wrong=[[20, -1], [21, 12], [23, -1]]), "row 1: answer and wrong share a token id"),
    (dict(attention_mask=[[1, 1, 1, 1, 1], [1, 1, 2, 1, 1], [1, 1, 1, 0, 0]]), "attention_mask row 1 holds a value other than 0 and 1"),
    (dict(attention_mask=[[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 0, 1, 0, 0]]), "attention_mask row 2 has a real token after padding"),
    (dict(attention_mask=[[1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), "attention_mask row 1 has no real token first"),
    (dict(attention_mask=[[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]]), "attention_mask has shape [3, 4]"),
    (dict(metric="accuracy"), "unknown metric 'accuracy'; choose one of logit_diff, prob, prob_diff, kl"),
    (dict(texts=[{}]), "texts has 1 entries, clean 3 rows"),
    (dict(texts=["a", "b", "c"]), "texts must be one dict per example"),
    (dict(clean=[[1, 2], [3]]), "clean must be token ids [n, pos]"),
])
def test_bad_fields_are_one_line_errors_naming_the_row(changes, message):
    with pytest.raises(HeadscopeError, match=None) as caught:
        small(**changes)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_shapes_positions_subset_and_inputs():
    task = small(texts=[{"clean": str(i)} for i in range(3)])
    assert task.n == len(task) == 3
    assert task.position.tolist() == [4, 4, 2]
    assert Task(clean=[[1, 2]], corrupted=[[1, 3]], answer=[4], wrong=[5]).mask.tolist() == [[1, 1]]
    part = task.subset([2, 0])
    assert part.clean.tolist() == [[1, 2, 3, 0, 0], [5, 6, 7, 8, 9]] and part.position.tolist() == [2, 4]
    assert part.answer.tolist() == [[13, 14], [10, 11]] and [t["clean"] for t in part.texts] == ["2", "0"]
    assert task.subset(slice(1, 3)).wrong.tolist() == [[21, 22], [23, -1]]
    assert task.subset(torch.tensor([True, False, True])).position.tolist() == [4, 2]
    with pytest.raises(HeadscopeError, match="row 3 is outside the task's 3 rows"):
        task.subset([3])
    inputs = task.inputs("corrupted")
    assert inputs["input_ids"].tolist() == task.corrupted.tolist() and inputs["attention_mask"].tolist() == task.mask.tolist()
    with pytest.raises(HeadscopeError, match="which='clean' or 'corrupted'"):
        task.inputs("patched")


def reference_score(task, logits, reference=None):
    """The metrics written out one example at a time, from the formulas in docs/tasks.md."""
    values = []
    for i in range(task.n):
        last = int(task.mask[i].sum()) - 1
        row = logits[i, last].double()
        p = torch.softmax(row, -1)
        answers = [a for a in torch.atleast_1d(task.answer[i]).tolist() if a >= 0]
        wrongs = [w for w in torch.atleast_1d(task.wrong[i]).tolist() if w >= 0]
        if task.metric == "logit_diff":
            values.append(sum(row[a] for a in answers) / len(answers) - sum(row[w] for w in wrongs) / len(wrongs))
        elif task.metric == "prob":
            values.append(sum(p[a] for a in answers))
        elif task.metric == "prob_diff":
            values.append(sum(p[a] for a in answers) - sum(p[w] for w in wrongs))
        else:
            q = torch.softmax(reference[i, last].double(), -1)
            values.append(-sum(q[v] * (q[v].log() - p[v].log()) for v in range(row.shape[0])))
    return torch.tensor([float(v) for v in values], dtype=torch.float64)


@pytest.mark.parametrize("metric", ["logit_diff", "prob", "prob_diff", "kl"])
def test_score_equals_the_formula_per_example(metric):
    task = small(metric=metric)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 30, generator=generator) * 3
    clean = torch.randn(3, 5, 30, generator=generator) * 3
    got = task.score(logits, reference=clean)
    assert got.dtype == torch.float32 and got.shape == (3,)
    torch.testing.assert_close(got.double(), reference_score(task, logits, clean), atol=1e-5, rtol=1e-5)
    if metric == "kl":
        assert task.score(clean, reference=clean).abs().max() < 1e-6  # 0 on the clean run itself
        assert (got < 0).all()
    # the padding and the positions after the last real token are not read
    changed = logits.clone()
    changed[2, 3:] = 100.0
    torch.testing.assert_close(task.score(changed, reference=clean), got)


def test_score_is_differentiable():
    task = small(metric="logit_diff")
    logits = torch.randn(3, 5, 30, dtype=torch.float64, requires_grad=True)
    task.score(logits).sum().backward()
    # d logit_diff / d logit: +1/|A| on the answers, -1/|W| on the wrong ones, at the last real token only
    expected = torch.zeros(3, 5, 30, dtype=torch.float64)
    expected[0, 4, [10, 11]], expected[0, 4, 20] = 0.5, -1.0
    expected[1, 4, 12], expected[1, 4, [21, 22]] = 1.0, -0.5
    expected[2, 2, [13, 14]], expected[2, 2, 23] = 0.5, -1.0
    torch.testing.assert_close(logits.grad, expected)
    reference = torch.randn(3, 5, 30, dtype=torch.float64)
    rows, position = torch.arange(3), small().position

    def at_position(x):  # the logits read at each example's position, the rest fixed
        full = reference.clone()
        full[rows, position] = x
        return full

    for metric in ("prob", "prob_diff", "kl"):
        scored = small(metric=metric)
        x = torch.randn(3, 30, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda x: scored.score(at_position(x), reference=reference), (x,), fast_mode=True)


def test_score_refuses_logits_that_do_not_fit():
    task = small()
    with pytest.raises(HeadscopeError, match="logits for 2 examples, the task has 3; score a batch with task.subset"):
        task.score(torch.zeros(2, 5, 30))
    with pytest.raises(HeadscopeError, match="token id 23 of the task's answers is outside the 20 logits"):
        task.score(torch.zeros(3, 5, 20))
    with pytest.raises(HeadscopeError, match="logits of 4 positions; the task's last real token is at 4"):
        task.score(torch.zeros(3, 4, 30))
    with pytest.raises(HeadscopeError, match="pass reference=<clean logits>"):
        small(metric="kl").score(torch.zeros(3, 5, 30))


def test_direction_reads_the_logit_difference_from_the_residual():
    task = small()
    generator = torch.Generator().manual_seed(1)
    unembed = torch.randn(30, 8, generator=generator, dtype=torch.float64)  # [vocab, d]
    hidden = torch.randn(3, 5, 8, generator=generator, dtype=torch.float64)
    direction = task.direction(unembed)
    assert direction.shape == (3, 8)
    torch.testing.assert_close(direction[1], unembed[12] - (unembed[21] + unembed[22]) / 2)
    last = hidden[torch.arange(3), task.position]
    torch.testing.assert_close((last * direction).sum(-1), task.score(hidden @ unembed.T))
    with pytest.raises(HeadscopeError, match="for the logit_diff metric only; this task's is 'prob'"):
        task.with_metric("prob").direction(unembed)


def test_check_for_refuses_another_tokenizer_or_ids_beyond_the_vocabulary(words):
    model = tiny_model("gpt2", seed=0, kind="odd")  # vocab 99
    task = headscope.task("ioi", words, n=4)
    task.check_for(model, words)
    task.check_for((model, words))
    other = ioi_tokenizer(bos=False)  # same vocabulary, other special-token use: same fingerprint
    assert tokenizer_fingerprint(other) == task.tokenizer
    different = word_tokenizer(["Mary", "John"])
    with pytest.raises(HeadscopeError, match=r"task 'ioi' was built for another tokenizer \(58-\w+; this model's is 6-\w+\); "
                                             "build it with this model's tokenizer"):
        task.check_for(model, different)
    big = Task(clean=[[1, 98]], corrupted=[[1, 2]], answer=[3], wrong=[4], name="mine")
    big.check_for(model, different)  # no fingerprint: only the ids are checked
    big = Task(clean=[[1, 150]], corrupted=[[1, 2]], answer=[3], wrong=[4], name="mine")
    with pytest.raises(HeadscopeError, match="task 'mine' holds token id 150, outside this model's vocabulary of 99"):
        big.check_for(model)


def test_fingerprint_is_stable_and_sees_every_change(words, tmp_path):
    words.save_pretrained(tmp_path / "tok")
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(words) == tokenizer_fingerprint(ioi_tokenizer())
    assert tokenizer_fingerprint(words).startswith(f"{len(words)}-")
    swapped = list(reversed(IOI_NAMES))  # same tokens, other ids
    others = word_tokenizer(template_words(*IOI_TEMPLATES) + swapped + IOI_PLACES + IOI_OBJECTS)
    assert sorted(others.get_vocab()) == sorted(words.get_vocab())
    assert tokenizer_fingerprint(others) != tokenizer_fingerprint(words)
    words_pad = ioi_tokenizer()
    words_pad.pad_token = "[EOS]"
    assert tokenizer_fingerprint(words_pad) != tokenizer_fingerprint(words)


def test_save_and_load_round_trip(tmp_path, words):
    for task in (headscope.task("ioi", words, n=5, seed=3), small(metric="prob_diff", name="sets")):
        path = task.save(tmp_path / "task.json", force=True)  # the second replaces the first: a task file
        back = Task.load(path)
        for field in ("clean", "corrupted", "answer", "wrong"):
            assert torch.equal(getattr(back, field), getattr(task, field))
        assert (back.attention_mask is None) == (task.attention_mask is None)
        assert torch.equal(back.mask, task.mask)
        assert (back.metric, back.name, back.texts, back.tokenizer) == (task.metric, task.name, task.texts, task.tokenizer)
    assert [p.name for p in tmp_path.iterdir()] == ["task.json"]  # written to a temporary name and renamed


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not a task file (invalid JSON"),
    ('{"clean": [[1]]}', 'is not a task file (no "format": "headscope-task"'),
    ('{"format": "headscope-task", "version": 7}', "is a task file of version 7"),
    ('{"format": "headscope-task", "version": 1, "clean": [[1]]}', "is not a complete task file: no 'corrupted'"),
    ('{"format": "headscope-task", "version": 1, "clean": [[1]], "corrupted": [[1, 2]], "answer": [1], "wrong": [2]}',
     "task.json: Task corrupted has shape [1, 2], clean [1, 1]"),
])
def test_load_refuses_what_is_not_a_task(tmp_path, content, message):
    (tmp_path / "task.json").write_text(content)
    with pytest.raises(HeadscopeError) as caught:
        Task.load(tmp_path / "task.json")
    assert message in str(caught.value) and str(tmp_path) in str(caught.value)
    with pytest.raises(HeadscopeError, match="cannot read task file"):
        Task.load(tmp_path / "missing.json")


# --- the built-ins -------------------------------------------------------------------------------

def test_ioi_prompts_answers_and_abc_corruption(words):
    task = headscope.task("ioi", words, n=24, seed=5)
    assert (task.name, task.metric, task.n) == ("ioi", "logit_diff", 24)
    assert task.answer.shape == task.wrong.shape == (24,)
    vocab = words.get_vocab()
    names = {vocab[name] for name in IOI_NAMES}
    for i in range(task.n):
        length = int(task.mask[i].sum())
        clean, corrupted = task.clean[i, :length].tolist(), task.corrupted[i, :length].tolist()
        assert clean[0] == vocab["[BOS]"] and vocab["[BOS]"] not in clean[1:]
        assert (task.clean[i, length:] == vocab["[PAD]"]).all()
        io, s = int(task.answer[i]), int(task.wrong[i])
        clean_names = [t for t in clean if t in names]
        # ABB on even rows, BAB on odd ones; the subject repeated, the IO once
        assert clean_names == ([io, s, s] if i % 2 == 0 else [s, io, s])
        corrupted_names = [t for t in corrupted if t in names]
        assert len(set(corrupted_names)) == 3 and not {io, s} & set(corrupted_names)  # ABC: three other names
        assert [a for a, b in zip(clean, corrupted) if a != b] == clean_names  # only the names differ
        assert words(task.texts[i]["clean"])["input_ids"] == clean
        assert words(task.texts[i]["corrupted"])["input_ids"] == corrupted
        assert words(task.texts[i]["answer"], add_special_tokens=False)["input_ids"] == [io]
    assert torch.equal(headscope.task("ioi", words, n=24, seed=5).clean, task.clean)
    assert not torch.equal(headscope.task("ioi", words, n=24, seed=6).clean, task.clean)
    assert task.attention_mask is not None  # templates of several lengths: right-padded


def test_prompts_keep_a_leading_bos_and_drop_a_trailing_eos():
    task = headscope.task("ioi", ioi_tokenizer(bos=True, eos=True), n=4)
    eos = ioi_tokenizer().get_vocab()["[EOS]"]
    assert (task.clean[:, 0] == 2).all() and not (task.clean == eos).any()
    plain = headscope.task("ioi", ioi_tokenizer(bos=False), n=4)
    assert torch.equal(plain.answer, task.answer) and plain.clean.shape[1] == task.clean.shape[1] - 1


def test_answers_are_tokenized_as_they_continue_a_prompt(tmp_path):
    """A SentencePiece tokenizer encodes ' Mary' alone as ['▁', '▁Mary'], but after a word as '▁Mary',
    the token the model predicts: names count as single tokens, and answers are that token."""
    tokenizer = sentencepiece_tokenizer(template_words(*IOI_TEMPLATES) + IOI_NAMES + IOI_PLACES + IOI_OBJECTS)
    assert tokenizer.convert_ids_to_tokens(tokenizer(" Mary", add_special_tokens=False)["input_ids"]) == ["\u2581", "\u2581Mary"]
    task = headscope.task("ioi", tokenizer, n=8)
    for i in range(task.n):
        assert tokenizer.convert_ids_to_tokens([int(task.answer[i])]) == ["\u2581" + task.texts[i]["answer"].strip()]
        assert int(task.answer[i]) in task.clean[i].tolist()
    path = write_lines(tmp_path / "sp.jsonl", GOOD)
    assert tokenizer.convert_ids_to_tokens(headscope.task(path, tokenizer).answer.tolist()) == ["\u2581Mary"]


def test_ioi_needs_single_token_names():
    tokenizer = word_tokenizer(["Mary", "John", "store", "drink", "When", "and"])
    with pytest.raises(HeadscopeError, match="ioi needs at least 5 names, 1 place and 1 object that are single tokens "
                                             r"\(with a leading space\) in this tokenizer; it has 2 names, 1 places, 1 objects"):
        headscope.task("ioi", tokenizer)


def test_induction_repeats_a_random_sequence(words):
    length = 6
    task = headscope.task("induction", words, n=16, seed=2, length=length)
    size = len(words.get_vocab())
    assert task.clean.shape == (16, 1 + 2 * length - 1) and task.attention_mask is None
    for i in range(task.n):
        clean, corrupted = task.clean[i].tolist(), task.corrupted[i].tolist()
        assert clean[0] == corrupted[0] == 2  # the BOS the tokenizer puts first
        sequence = clean[1:1 + length]
        assert len(set(sequence)) == length and all(size // 4 <= t < 3 * size // 4 for t in sequence)
        assert clean[1 + length:] == sequence[:-1] and int(task.answer[i]) == sequence[-1]
        fresh = corrupted[1 + length:]
        assert corrupted[:1 + length] == clean[:1 + length] and not set(fresh) & set(sequence)
        assert int(task.wrong[i]) not in set(sequence) | set(fresh)
    assert len(set(task.answer.tolist())) > 1
    assert headscope.task("induction", year_tokenizer("pairs"), n=2).clean.shape[1] == 1 + 2 * 20 - 1  # L = 20 by default
    with pytest.raises(HeadscopeError, match="induction with length 40 needs 80 distinct tokens from the middle of the vocabulary"):
        headscope.task("induction", words, length=40)
    with pytest.raises(HeadscopeError, match="length is the induction task's sequence length"):
        headscope.task("ioi", words, length=5)


def test_induction_keys_changes_only_the_token_before_the_answers_first_occurrence(words):
    length = 6
    plain = headscope.task("induction", words, n=16, seed=2, length=length)
    task = headscope.task("induction-keys", words, n=16, seed=2, length=length)
    assert task.name == "induction-keys"
    # the same draws: clean prompts, answers and wrong tokens are the induction task's
    assert torch.equal(task.clean, plain.clean) and torch.equal(task.answer, plain.answer)
    assert torch.equal(task.wrong, plain.wrong)
    for i in range(task.n):
        clean, corrupted = task.clean[i].tolist(), task.corrupted[i].tolist()
        changed = [p for p in range(len(clean)) if clean[p] != corrupted[p]]
        # r_{L-2} of the first copy (after the BOS), the token the answer r_{L-1} follows there
        assert changed == [length - 1] and clean[length - 1] == clean[-1]
        assert corrupted[length] == int(task.answer[i])  # the answer's first occurrence is kept
        # the replacement is the induction task's first fresh token: seen nowhere in the clean prompt
        assert corrupted[length - 1] == plain.corrupted[i, 1 + length] and corrupted[length - 1] not in clean
        assert corrupted[length - 1] != int(task.wrong[i])
    short = headscope.task("induction-keys", words, n=2, seed=0, length=2)  # r_0 r_1 r_0: r_0 of the first copy changes
    assert [p for p in range(4) if short.clean[0, p] != short.corrupted[0, p]] == [1]
    with pytest.raises(HeadscopeError, match="induction-keys with length 40 needs 80 distinct tokens"):
        headscope.task("induction-keys", words, length=40)


def test_greater_than_sets_and_corruption():
    tokenizer = year_tokenizer("pairs")
    task = headscope.task("greater-than", tokenizer, n=12, seed=1)
    assert task.metric == "prob_diff" and headscope.task("greater-than", tokenizer, n=2, metric="logit_diff").metric == "logit_diff"
    vocab = tokenizer.get_vocab()
    digits = [vocab[f"{yy:02d}"] for yy in range(100)]
    for i in range(task.n):
        text = task.texts[i]["clean"]
        start = int(text.split(" to the year")[0][-2:])
        assert 2 <= start <= 98 and int(text.split("year ")[1][:2]) in GT_CENTURIES
        assert [a for a in task.answer[i].tolist() if a >= 0] == digits[start + 1:]
        assert [w for w in task.wrong[i].tolist() if w >= 0] == digits[:start + 1]
        assert task.texts[i]["corrupted"] == text.replace(f"{start:02d} to", "01 to")
        assert [a for a, b in zip(task.clean[i].tolist(), task.corrupted[i].tolist()) if a != b] == [digits[start]]
        assert task.clean[i, -1] == vocab[text[-2:]]  # the prompt ends on the century
    # the metric: probability of the later years minus that of the earlier ones
    logits = torch.randn(12, task.clean.shape[1], len(vocab), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(task.score(logits).double(), reference_score(task, logits), atol=1e-6, rtol=1e-6)


def test_greater_than_refuses_a_tokenizer_that_splits_digits():
    with pytest.raises(HeadscopeError) as caught:
        headscope.task("greater-than", year_tokenizer("single"))
    assert str(caught.value).endswith("this tokenizer splits ' 1732' into ['1', '7', '3', '2']")


def test_unknown_name_and_bad_arguments(words):
    with pytest.raises(HeadscopeError, match="unknown task 'iox'; the built-ins are ioi, induction, induction-keys, greater-than, "
                                             "or give the path of a .jsonl file"):
        headscope.task("iox", words)
    with pytest.raises(HeadscopeError, match="n must be an integer of at least 1, got 0"):
        headscope.task("ioi", words, n=0)
    with pytest.raises(HeadscopeError, match="unknown metric 'acc'"):
        headscope.task("ioi", words, metric="acc")
    with pytest.raises(HeadscopeError, match="takes the model's tokenizer"):
        headscope.task("ioi", "gpt2")


def test_a_loaded_model_stands_for_its_tokenizer(planted):
    from tests.support.planted import char_tokenizer

    task = headscope.task("induction", planted, n=3, length=4)
    assert task.tokenizer == tokenizer_fingerprint(char_tokenizer())
    task.check_for(planted)


# --- JSONL files ---------------------------------------------------------------------------------

def write_lines(path, *lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


GOOD = {"clean": "When Mary and John went to the store, John gave a drink to",
        "corrupted": "When Alice and Bob went to the store, Tom gave a drink to", "answer": " Mary", "wrong": " John"}


def test_jsonl_examples_sets_and_first_n(tmp_path, words):
    short = {"clean": "Then, Kate and Emma had a long argument. Afterwards Emma said to",
             "corrupted": "Then, Tom and Bob had a long argument. Afterwards John said to",
             "answer": ["Kate", "Mary"], "wrong": "Emma"}
    path = write_lines(tmp_path / "mine.jsonl", GOOD, "", short, GOOD)
    task = headscope.task(path, words)
    vocab = words.get_vocab()
    assert (task.name, task.n) == ("mine", 3)
    assert task.answer.tolist() == [[vocab["Mary"], -1], [vocab["Kate"], vocab["Mary"]], [vocab["Mary"], -1]]
    assert task.wrong.tolist() == [[vocab["John"]], [vocab["Emma"]], [vocab["John"]]]
    assert task.clean[1, :int(task.mask[1].sum())].tolist() == words(short["clean"])["input_ids"]
    assert task.texts[1]["answer"] == "Kate | Mary"
    first = headscope.task(str(path), words, n=1)
    assert first.n == 1 and first.answer.tolist() == [vocab["Mary"]]  # single answers stay [n]
    with pytest.raises(HeadscopeError, match="mine.jsonl holds 3 examples, fewer than n=5"):
        headscope.task(path, words, n=5)


@pytest.mark.parametrize("line, message", [
    ('{"clean": "When Mary"', ":2: invalid JSON ("),
    ("[1, 2]", ":2: expected a JSON object with clean, corrupted, answer, wrong; got list"),
    ({k: v for k, v in GOOD.items() if k != "wrong"}, ":2: no 'wrong' field"),
    (dict(GOOD, clean=""), ":2: 'clean' must be a non-empty string"),
    (dict(GOOD, answer=[]), ":2: 'answer' must be a string or a non-empty list of strings"),
    (dict(GOOD, corrupted="When Alice and Bob went to the store, Tom gave a drink"),
     ":2: clean has 15 tokens and corrupted 14; they must have as many"),
    (dict(GOOD, answer=" Mary John"), ":2: answer ' Mary John' is 2 tokens ['Mary', 'John'], not one"),
    (dict(GOOD, wrong=" Zed"), ":2: wrong ' Zed' is the unknown token of this tokenizer"),
    (dict(GOOD, wrong=[" John", " Mary"]), ":2: answer and wrong share a token"),
])
def test_jsonl_errors_name_the_file_and_line(tmp_path, words, line, message):
    path = write_lines(tmp_path / "bad.jsonl", GOOD, line)
    with pytest.raises(HeadscopeError) as caught:
        headscope.task(path, words)
    assert f"{path}{message}" in str(caught.value) and "\n" not in str(caught.value)


def test_jsonl_empty_or_missing_file(tmp_path, words):
    with pytest.raises(HeadscopeError, match="empty.jsonl holds no examples"):
        headscope.task(write_lines(tmp_path / "empty.jsonl", "", "  "), words)
    with pytest.raises(HeadscopeError, match="cannot read task file .*missing.jsonl"):
        headscope.task(tmp_path / "missing.jsonl", words)


def test_the_docs_example_from_token_ids_runs():
    """docs/tasks.md's second code block (the first needs SmolLM2)."""
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "tasks.md").read_text()
    block = page.split("```python")[2].split("```")[0]
    space = {}
    exec(block, space)
    task, logits = space["task"], space["logits"]
    assert task.position.tolist() == [3, 2]
    expected = [logits[0, 3, 10] - (logits[0, 3, 12] + logits[0, 3, 13]) / 2, logits[1, 2, 11] - logits[1, 2, 14]]
    torch.testing.assert_close(task.score(logits), torch.stack(expected))
