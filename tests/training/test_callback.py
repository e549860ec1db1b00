"""`HeadscopeCallback` inside a `transformers.Trainer`: losses unchanged, summaries logged, the
folder written at saves and at the end, a resumed run continuing the timeline."""
import pandas as pd
import pytest
import torch

import headscope
from headscope.training.toy import repeated_segments, tiny_llama, train_toy

STEPS, EVERY = 12, 4


def _run(folder, callbacks, steps=STEPS, save_steps=0, resume=None, seed=0):
    torch.manual_seed(seed)
    model = tiny_llama(2)
    ids, _ = repeated_segments(steps * 64, torch.Generator().manual_seed(seed))
    return train_toy(model, ids, steps, folder, callbacks, save_steps=save_steps, resume=resume, seed=seed)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("callback")
    plain = _run(root / "plain", [])
    callback = headscope.HeadscopeCallback(every=EVERY, out=root / "timeline")
    tracked = _run(root / "tracked", [callback])
    return root, plain, tracked, callback


def test_losses_are_bit_identical_with_and_without_the_callback(runs):
    _, plain, tracked, _ = runs
    assert len(plain) == STEPS and plain == tracked


def test_the_timeline_folder_has_every_record_and_the_logs_carry_the_summary(runs):
    root, _, _, callback = runs
    scores = pd.read_csv(root / "timeline" / "timeline.csv")
    assert sorted(scores.step.unique()) == [0, 4, 8, 12]
    assert (root / "timeline" / ".headscope").is_file()
    steps = pd.read_csv(root / "timeline" / "steps.csv").set_index("step")
    assert steps.train_loss.loc[[4, 8, 12]].notna().all()  # the loss the Trainer logged at that step
    assert isinstance(callback.timeline, headscope.Timeline)


def test_the_summary_reaches_the_trainers_log_history(tmp_path):
    import transformers as tf

    callback = headscope.HeadscopeCallback(every=EVERY, out=tmp_path / "timeline")
    torch.manual_seed(0)
    model = tiny_llama(1)
    ids, _ = repeated_segments(8 * 64, torch.Generator().manual_seed(0))
    from headscope.training.toy import _Rows

    args = tf.TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=64, max_steps=8,
                                logging_steps=100, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no")
    seen = []

    class Reporter(tf.TrainerCallback):  # stands for an integration such as TensorBoard (called before user callbacks)
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(dict(logs))

    trainer = tf.Trainer(model=model, args=args, train_dataset=_Rows(ids), callbacks=[Reporter(), callback])
    trainer.train()
    logged = [row for row in trainer.state.log_history if "headscope/induction_max" in row]
    assert [row["step"] for row in logged] == [4, 8]
    assert {"headscope/icl_score", "headscope/previous_token_max", "headscope/uniform_heads"} <= set(logged[0])
    # the integration listed before the callback received the entries too (both logs at steps 4 and 8)
    assert sum("headscope/icl_score" in row for row in seen) == 2


def test_a_resumed_run_continues_the_timeline(tmp_path):
    first = headscope.HeadscopeCallback(every=EVERY, out=tmp_path / "timeline")
    _run(tmp_path / "run", [first], steps=8, save_steps=4)
    assert sorted(pd.read_csv(tmp_path / "timeline" / "timeline.csv").step.unique()) == [0, 4, 8]
    again = headscope.HeadscopeCallback(every=EVERY, out=tmp_path / "timeline")
    _run(tmp_path / "run", [again], steps=12, resume=str(tmp_path / "run" / "checkpoint-4"))
    scores = pd.read_csv(tmp_path / "timeline" / "timeline.csv")
    assert sorted(scores.step.unique()) == [0, 4, 8, 12]
    assert not scores.duplicated(["step", "layer", "head", "detector"]).any()
    assert (tmp_path / "timeline" / "control" / "config.json").is_file()  # the step-0 control, kept for resumes
