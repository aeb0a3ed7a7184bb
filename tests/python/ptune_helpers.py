"""Shared helpers of the `loom ptune` tests: a tiny frozen base, a small task made from the
bundled corpus, prompt-learning recipes, and reading back runs and their inference tables."""
import json
import pathlib
import re

import torch
from safetensors.torch import load_file

from test_data_helpers import ROOT
from train_helpers import run_loom, run_train, tiny_overrides

VOCAB = ROOT / "data" / "gpt2-vocab.json"
MERGES = ROOT / "data" / "gpt2-merges.txt"
TEMPLATE = "<|VIRTUAL_PROMPT_0|> Line:{text}<|VIRTUAL_PROMPT_1|> Mood:{label}"

# method name -> recipe overrides (p-tuning encoders and prompt tuning)
METHODS = {
    "embedding": ["model.virtual_prompt_style=p-tuning", "model.p_tuning.encoder_type=embedding"],
    "mlp": ["model.virtual_prompt_style=p-tuning", "model.p_tuning.encoder_type=mlp", "model.p_tuning.dropout=0.1"],
    "lstm": ["model.virtual_prompt_style=p-tuning", "model.p_tuning.encoder_type=lstm"],
    "tpmlp": ["model.virtual_prompt_style=p-tuning", "model.p_tuning.encoder_type=tpmlp"],
    "prompt-tuning": ["model.virtual_prompt_style=prompt-tuning",
                      "model.prompt_tuning.new_prompt_init_methods=[text]",
                      "model.prompt_tuning.new_prompt_init_text=[' love and death']"],
}


def make_base(corpus, run_dir, extra=()):
    """A tiny GPT (4 layers, hidden 32, 32 positions; `extra`: model overrides such as
    train_helpers.LLAMA) trained for 2 steps at t=1 p=1."""
    run_train(tiny_overrides(corpus, run_dir, steps=2, global_batch=4, extra=extra))
    return run_dir


def write_task(folder, n_train=48, n_valid=16):
    """Lines of the corpus labelled by the words they hold (' love' / ' death'), short enough for
    32 positions; returns the (train, valid) paths."""
    love = {"love", "sweet", "fair", "gentle", "joy", "kiss", "heart"}
    death = {"death", "blood", "kill", "grave", "die", "sword", "war"}
    records = {" love": [], " death": []}
    for line in (ROOT / "data" / "tinyshakespeare.txt").read_text().splitlines():
        words = {w.strip(",.;:!?'").lower() for w in line.split()}
        label = " love" if words & love and not words & death else " death" if words & death and not words & love else None
        if label and 8 < len(line) < 60:
            records[label].append({"taskname": "mood", "text": " " + line.strip(), "label": label})
    rows = [r for pair in zip(records[" love"], records[" death"]) for r in pair]
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, part in [("train", rows[:n_train]), ("valid", rows[n_train:n_train + n_valid])]:
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in part))
        paths.append(path)
    return paths


def write_recipe(path, base_dir, train, valid, extra_tasks="", gpt2_tokenizer=True):
    """A p-tuning recipe of the 'mood' task over `base_dir`; without `gpt2_tokenizer` the run
    takes the base's own tokenizer (e.g. the tokenizer.json of a Hugging Face import)."""
    tokenizer = f"""  tokenizer:
    vocab_file: {VOCAB}
    merge_file: {MERGES}
""" if gpt2_tokenizer else ""
    path.write_text(f"""trainer:
  devices: 1
  accelerator: cpu
  precision: 32
  max_steps: 4
  log_every_n_steps: 1
  val_check_interval: 4
  limit_val_batches: 100
exp_manager:
  checkpoint_callback_params:
    every_n_steps: 4
model:
  micro_batch_size: 2
  global_batch_size: 8
  language_model_path: {base_dir}
  virtual_prompt_style: p-tuning
{tokenizer}  task_templates:
    - taskname: mood
      prompt_template: "{TEMPLATE}"
      prompt_template_fields: [text, label]
      total_virtual_tokens: 4
      virtual_token_splits: [3, 1]
      answer_only_loss: true
      answer_field: label
      truncate_field: text
{extra_tasks}  p_tuning:
    encoder_hidden: 16
  data:
    train_ds: [{train}]
    validation_ds: [{valid}]
    max_seq_length: 32
  optim:
    lr: 3.0e-2
    sched:
      warmup_steps: 1
""")
    return path


def layout_overrides(run_dir, t=1, p=1, d=1):
    return [f"trainer.devices={t * p * d}", f"exp_manager.explicit_log_dir={run_dir}",
            f"model.tensor_model_parallel_size={t}", f"model.pipeline_model_parallel_size={p}",
            f"model.sequence_parallel={'true' if t > 1 else 'false'}",
            f"model.activations_checkpoint_granularity={'selective' if t > 1 else 'null'}"]


def run_ptune(recipe, overrides, *flags, check=True, timeout=600):
    return run_loom("ptune", recipe, overrides, *flags, check=check, timeout=timeout)


def tables(run_dir, folder="prompt_tables"):
    """Every task's inference table as written (read with the safetensors library)."""
    index = json.loads((pathlib.Path(run_dir) / folder / "index.json").read_text())
    return {t["taskname"]: load_file(pathlib.Path(run_dir) / folder / t["file"])["prompt_table"] for t in index["tasks"]}


def base_digests(stderr):
    """What a run logged of its frozen base: the whole checkpoint's digest, and every rank's
    digests of its slice after building and at the end (pairs: before, after)."""
    whole = re.findall(r"checkpoint digest ([0-9a-f]{16})", stderr)
    before = re.findall(r"base parameters of this rank: digest ([0-9a-f]{16})", stderr)
    after = re.findall(r"base parameters unchanged \(digest ([0-9a-f]{16})\)", stderr)
    return whole, before, after


def directory_bytes(folder):
    """Every file's bytes below `folder`, by relative path (to show a base is untouched)."""
    folder = pathlib.Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def tensor_close(a, b, rtol=1e-4, atol=1e-5):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
