"""`loom finetune` on supervised fine-tuning data (docs/design/finetune.md): prompt/answer records
laid out through prompt_template and chat records rendered with a chat template, checked token
by token against the GPT-2 tokenizer and transformers' apply_chat_template; the answer-only loss
mask covers exactly the answer tokens; packed rows hold each example's own row with positions
restarting and segment ids; full-parameter SFT and LoRA, packed or not, train at t=2 x p=2 (SP
on) as one process does; a full SFT run is a model generate reads; bad records are named by
file, line and field before any rank starts."""
import json
import math
import subprocess

import pytest
import torch

from ptune_helpers import MERGES, VOCAB, make_base
from sft_helpers import CHAT_TEMPLATE, word_records, write_jsonl
from test_data_helpers import ROOT, loom_binary
from train_helpers import full_parameters, make_corpus, metrics, run_loom

EOS = 50256  # GPT-2's <|endoftext|>: EOS and padding


def chat_records(n, seed):
    out = []
    for r in word_records(n, seed):
        messages = [{"role": "user", "content": r["input"]}, {"role": "assistant", "content": r["output"]}]
        if len(out) % 2:  # a two-turn conversation: both assistant turns are answers
            messages += [{"role": "user", "content": "Again?"}, {"role": "assistant", "content": r["output"]}]
        out.append({"messages": messages})
    return out


def write_recipe(path, base, train, valid, extra=""):
    path.write_text(f"""trainer:
  devices: 1
  accelerator: cpu
  precision: 32
  max_steps: 3
  log_every_n_steps: 1
  val_check_interval: 3
  limit_val_batches: 1
exp_manager:
  checkpoint_callback_params:
    every_n_steps: 3
model:
  micro_batch_size: 2
  global_batch_size: 8
  restore_from_path: {base}
  peft:
    peft_scheme: none
    lora_tuning:
      target_modules: [all]
      adapter_dim: 4
      alpha: 8
  data:
    train_ds:
      file_names: [{train}]
      max_seq_length: 32
{extra}    validation_ds:
      file_names: [{valid}]
  optim:
    lr: 1.0e-2
    sched:
      warmup_steps: 1
""")
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    corpus = make_corpus(tmp_path_factory)
    base = make_base(corpus, tmp_path_factory.mktemp("sft_base"))
    folder = tmp_path_factory.mktemp("sft_data")
    train = write_jsonl(folder / "train.jsonl", word_records(40, 1))
    valid = write_jsonl(folder / "valid.jsonl", word_records(8, 2))
    chat = write_jsonl(folder / "chat.jsonl", chat_records(8, 3))
    template = folder / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    recipe = write_recipe(folder / "sft.yaml", base, train, valid)
    return {"base": base, "recipe": recipe, "train": train, "valid": valid, "chat": chat, "template": template,
            "folder": folder}


def finetune(setup, overrides, *flags, check=True, recipe=None):
    return run_loom("finetune", recipe or setup["recipe"], overrides, *flags, check=check)


def show(setup, overrides, n):
    done = finetune(setup, overrides, "--show-examples", str(n))
    return [json.loads(line) for line in done.stdout.splitlines()]


def gpt2():
    from transformers import GPT2TokenizerFast
    return GPT2TokenizerFast(str(VOCAB), str(MERGES))


def layout(run_dir, t=1, p=1):
    return [f"trainer.devices={t * p}", f"exp_manager.explicit_log_dir={run_dir}",
            f"model.tensor_model_parallel_size={t}", f"model.pipeline_model_parallel_size={p}",
            f"model.sequence_parallel={'true' if t > 1 else 'false'}",
            f"model.activations_checkpoint_granularity={'selective' if t > 1 else 'null'}"]


@pytest.mark.parametrize("answer_only", [True, False])
def test_prompt_answer_rows_hold_the_template_and_mask_exactly_the_answer(setup, answer_only):
    tok = gpt2()
    rows = show(setup, [f"model.answer_only_loss={str(answer_only).lower()}"], 5)
    records = word_records(40, 1)
    assert len(rows) == 5
    for row, record in zip(rows, records):
        prompt = tok.encode(record["input"])
        ids = prompt + tok.encode(" " + record["output"]) + [EOS]  # "{input} {output}" and the EOS
        n = len(ids) - 1
        s = len(row["tokens"])
        assert s == 16  # the longest input (14) rounded up to 8
        assert row["tokens"] == ids[:-1] + [EOS] * (s - n)
        assert row["labels"] == ids[1:] + [EOS] * (s - n)
        want = [1.0 if (j + 1 >= len(prompt) or not answer_only) and j < n else 0.0 for j in range(s)]
        assert row["loss_mask"] == want, (row["text"], row["loss_mask"])
        assert row["position_ids"] == list(range(s)) and "segment_ids" not in row
        assert row["text"] == [tok.decode(ids)]


def test_chat_rows_equal_transformers_apply_chat_template(setup):
    tok = gpt2()
    tok.chat_template = CHAT_TEMPLATE
    rows = show(setup, [f"model.data.train_ds.file_names=[{setup['chat']}]",
                        f"model.data.train_ds.chat_template={setup['template']}"], 4)
    for row, record in zip(rows, chat_records(8, 3)):
        messages = record["messages"]
        whole = tok.apply_chat_template(messages, tokenize=False)
        assert row["text"] == [whole]
        # The assistant turns, located in transformers' own renders of the conversation's prefixes.
        ids, answer, done = [], [], 0
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = len(tok.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True))
            through = len(tok.apply_chat_template(messages[:i + 1], tokenize=False))
            for text, is_answer in ((whole[done:before], 0), (whole[before:through], 1)):
                piece = tok.encode(text)
                ids += piece
                answer += [is_answer] * len(piece)
            done = through
        assert whole[done:] == ""
        n = len(ids) - 1
        assert row["tokens"][:n] == ids[:-1] and row["labels"][:n] == ids[1:]
        assert row["loss_mask"] == [float(a) for a in answer[1:]] + [0.0] * (len(row["tokens"]) - n)
        assert sum(row["loss_mask"]) > 0


def test_packed_rows_hold_each_examples_row_with_restarting_positions(setup):
    unpacked = show(setup, [], 40)
    packed = show(setup, ["model.data.train_ds.packed_sequence=true"], 40)
    by_source = {r["sources"][0]: r for r in unpacked}
    assert sum(len(r["sources"]) for r in packed) == 40 and len(packed) < 40
    for row in packed:
        s = len(row["tokens"])
        assert s == 32  # max_seq_length's inputs (31) rounded up to 8, at most 32
        j = 0
        for k, source in enumerate(row["sources"]):
            alone = by_source[source]
            n = alone["labels"].index(EOS) + 1  # its inputs: the label EOS ends the example
            for key in ("tokens", "labels", "loss_mask"):
                assert row[key][j:j + n] == alone[key][:n], (key, source)
            assert row["position_ids"][j:j + n] == list(range(n))
            assert row["segment_ids"][j:j + n] == [k] * n
            j += n
        pads = s - j
        assert row["segment_ids"][j:] == [len(row["sources"])] * pads
        assert row["loss_mask"][j:] == [0.0] * pads and row["position_ids"][j:] == [0] * pads


_reference = {}


def reference(setup, tmp_path_factory, key, overrides):
    if key not in _reference:
        run_dir = tmp_path_factory.mktemp("sft_reference")
        _reference[key] = (run_dir, finetune(setup, layout(run_dir) + overrides).stderr)
    return _reference[key]


SCHEMES = {"full": ["model.peft.peft_scheme=none"], "lora": ["model.peft.peft_scheme=lora"]}


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("scheme", ["full", "lora"])
def test_t2p2_trains_as_one_process(setup, tmp_path_factory, tmp_path, scheme, packed):
    overrides = SCHEMES[scheme] + [f"model.data.train_ds.packed_sequence={str(packed).lower()}"]
    ref_dir, ref_log = reference(setup, tmp_path_factory, (scheme, packed), overrides)
    finetune(setup, layout(tmp_path, 2, 2) + overrides)
    got, want = metrics(tmp_path), metrics(ref_dir)
    assert [r["step"] for r in got] == [1, 2, 3]
    for g, w in zip(got, want):
        assert math.isclose(g["loss"], w["loss"], rel_tol=1e-5), (g["step"], g["loss"], w["loss"])
        assert math.isclose(g["grad_norm"], w["grad_norm"], rel_tol=1e-4), (g["step"], g["grad_norm"], w["grad_norm"])
    v_got, v_want = metrics(tmp_path, "validation"), metrics(ref_dir, "validation")
    assert [v["step"] for v in v_got] == [v["step"] for v in v_want] and v_got
    for g, w in zip(v_got, v_want):
        assert math.isclose(g["val_loss"], w["val_loss"], rel_tol=1e-5) and g["val_accuracy"] == w["val_accuracy"]
    theirs, ours = full_parameters(ref_dir, 3), full_parameters(tmp_path, 3)
    if "output_layer.weight" in ours and "output_layer.weight" not in theirs:  # the last stage's tied copy
        torch.testing.assert_close(ours.pop("output_layer.weight"), theirs["embedding.word_embeddings.weight"],
                                   rtol=1e-4, atol=1e-6)
    assert sorted(ours) == sorted(theirs)
    adapters = [n for n in ours if ".lora_" in n]
    assert (len(adapters) == len(ours)) if scheme == "lora" else not adapters
    base = full_parameters(setup["base"], 2)
    moved = [n for n in ours if n in base and not torch.equal(ours[n], base[n])]
    if scheme == "full":
        assert len(moved) > len(ours) // 2, moved  # every parameter trains
    for name, tensor in theirs.items():
        # atol 1e-5: entries near 0 whose gradient is rounding noise (the key biases) differ by ~1e-6
        torch.testing.assert_close(ours[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    if packed:
        assert "packing efficiency" in ref_log and [r["kind"] for r in metrics(ref_dir, "packing")] == ["packing"]


def test_full_sft_run_is_a_model_generate_and_train_read(setup, tmp_path_factory, tmp_path):
    ref_dir, _ = reference(setup, tmp_path_factory, ("full", False), SCHEMES["full"] + [
        "model.data.train_ds.packed_sequence=false"])
    gen = subprocess.run([str(loom_binary()), "generate", "--checkpoint", str(ref_dir), "--prompt",
                          "Words: king, love, day. The first word is", "--greedy", "--max-new-tokens", "2"],
                         cwd=ROOT, capture_output=True, timeout=300)
    assert gen.returncode == 0 and gen.stdout.startswith(b"Words: king"), gen.stderr[-2000:]
    assert (ref_dir / "finetune_config.yaml").is_file()
    assert "peft_scheme: none" in (ref_dir / "finetune_config.yaml").read_text()
    assert "restore_from_path" not in (ref_dir / "config.yaml").read_text()


def test_full_sft_on_mixed_records_keeps_its_chat_template(setup, tmp_path):
    mixed = write_jsonl(tmp_path / "mixed.jsonl", word_records(4, 7) + chat_records(4, 8))
    done = finetune(setup, layout(tmp_path) + [f"model.data.train_ds.file_names=[{mixed}]",
                                               f"model.data.train_ds.chat_template={setup['template']}",
                                               "trainer.max_steps=1", "trainer.val_check_interval=1",
                                               "exp_manager.checkpoint_callback_params.every_n_steps=1"])
    assert "8 examples (4 prompt/answer, 4 chat)" in done.stderr, done.stderr[-3000:]
    # Where loom serve's chat completions find the run's template.
    assert (tmp_path / "tokenizer" / "chat_template.jinja").read_text() == CHAT_TEMPLATE


@pytest.mark.parametrize("line,expected", [
    ("not json", "not valid JSON"),
    ('["a list"]', "expected a JSON object, found array"),
    ('{"input": "x"}', 'no field "output"'),
    ('{"input": "x", "output": 3}', 'field "output": expected a string, found number'),
    ('{"messages": "hello"}', '"messages": expected a non-empty list'),
    ('{"messages": [{"role": "user"}]}', '"messages"[0]: expected an object with string "role" and "content"'),
    ('{"messages": [{"role": "user", "content": "hi"}]}', 'a chat record ("messages"), but the base run has no chat '
                                                         'template (tokenizer/chat_template.jinja): set '
                                                         'model.data.train_ds.chat_template'),
])
def test_bad_records_are_named_by_file_line_and_field(setup, tmp_path, line, expected):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(word_records(1, 5)[0]) + "\n" + line + "\n")
    done = finetune(setup, layout(tmp_path) + [f"model.data.train_ds.file_names=[{bad}]"], check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"model.data.train_ds.file_names: {bad}:2: {expected}" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("override,expected", [
    ("model.data.train_ds.prompt_template='{output} {input}'", "model.data.train_ds.label_key"),
    ("model.data.train_ds.truncation_field=context", "model.data.train_ds.truncation_field"),
    ("model.data.train_ds.truncation_method=left", "model.data.train_ds.truncation_method"),
    ("model.peft.peft_scheme=ia3", "model.peft.peft_scheme"),
    ("model.data.train_ds.max_seq_length=64", "model.data.train_ds.max_seq_length"),
    ("model.data.validation_ds.file_names=[/nonexistent.jsonl]", "model.data.validation_ds.file_names"),
])
def test_bad_fields_are_named(setup, tmp_path, override, expected):
    done = finetune(setup, layout(tmp_path) + [override], check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert expected in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("t", [1, 2])
def test_a_packed_step_equals_the_same_examples_unpacked(setup, tmp_path, t):
    """Four examples in one step: packed into rows (at t=1, and at t=2 with sequence parallelism)
    or one per row, the step's loss (the mean over the same answer tokens) and gradient norm are
    the same: each packed example attends only to itself, from position 0 (the document mask and
    restarting positions, end to end through loom finetune)."""
    four = write_jsonl(tmp_path / "four.jsonl", word_records(4, 5))
    data = [f"model.data.train_ds.file_names=[{four}]", "trainer.max_steps=1", "trainer.val_check_interval=1",
            "exp_manager.checkpoint_callback_params.every_n_steps=1"]
    packed_rows = len(show(setup, data + ["model.data.train_ds.packed_sequence=true"], 10))
    assert packed_rows < 4  # some row holds two examples or more
    runs = {}
    for name, rows, packed, tp in (("unpacked", 4, False, 1), ("packed", packed_rows, True, t)):
        run_dir = tmp_path / name
        finetune(setup, layout(run_dir, tp) + data + SCHEMES["full"] + [
            f"model.data.train_ds.packed_sequence={str(packed).lower()}", f"model.micro_batch_size={rows}",
            f"model.global_batch_size={rows}"])
        runs[name] = metrics(run_dir)[0]
    assert math.isclose(runs["packed"]["loss"], runs["unpacked"]["loss"], rel_tol=1e-5), runs
    assert math.isclose(runs["packed"]["grad_norm"], runs["unpacked"]["grad_norm"], rel_tol=1e-5), runs
