"""recipes/README.md's field table is what tools/recipe_fields_table.py writes from the schema
(issue 28, "each default stated once"): every field of the three recipe kinds, each once, with the
requirement and the default `loom recipe-fields` reports, which it reads from csrc/config/recipe.h
through the schema. Changing a default in recipe.h without running the tool fails this test."""
import importlib.util
import json
import subprocess
import sys

from test_data_helpers import ROOT, loom_binary

TOOL = ROOT / "tools" / "recipe_fields_table.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("recipe_fields_table", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def schema():
    done = subprocess.run([str(loom_binary()), "recipe-fields"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_committed_table_is_the_generated_one():
    done = subprocess.run([sys.executable, str(TOOL), "--check", "--loom", str(loom_binary())],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (
        "recipes/README.md's field table differs from the schema: run "
        f"`.venv/bin/python tools/recipe_fields_table.py`\n{done.stdout}{done.stderr}")


def test_every_rule_in_the_table_belongs_to_a_field_of_the_schema():
    tool = load_tool()
    _, table, _ = tool.find_table((ROOT / "recipes" / "README.md").read_text())
    known = {path for path, _ in tool.merged_fields(schema())}
    rows = [tool.split_row(line)[0] for line in table[len(tool.HEADER):] if line.strip()]
    assert len(rows) == len(set(rows)), "a field has two rows"
    assert set(rows) == known


def test_the_schema_reports_known_defaults():
    # A few fields read the same in NeMo's megatron_gpt_config.yaml and recipe.h; this pins
    # the JSON shape the tool reads (YAML text, null for required and derived fields).
    fields = {f["field"]: f for f in schema()["pretraining"]}
    assert fields["trainer.log_every_n_steps"] == {"field": "trainer.log_every_n_steps", "need": "default",
                                                   "default": "10", "choices": []}
    assert fields["model.optim.betas"]["default"] == "[0.9, 0.98]"
    assert fields["model.hidden_size"]["need"] == "required" and fields["model.hidden_size"]["default"] is None
    assert fields["model.ffn_hidden_size"]["need"] == "derived"
    assert fields["trainer.precision"]["default"] == "bf16"
    assert ["bf16", "bf16-mixed"] in fields["trainer.precision"]["choices"]
    prompt = {f["field"] for f in schema()["prompt_learning"]}
    assert "model.language_model_path" in prompt and "model.language_model_path" not in fields
    assert "model.hidden_size" not in prompt
    finetune = {f["field"]: f for f in schema()["finetuning"]}
    assert finetune["model.restore_from_path"]["need"] == "required" and "model.hidden_size" not in finetune
    assert finetune["model.peft.lora_tuning.target_modules"]["default"] == "[attention_qkv]"
    assert finetune["model.data.train_ds.file_names"]["need"] == "required" and "model.data.seq_length" not in finetune
    assert finetune["model.data.train_ds.prompt_template"]["default"] == '"{input} {output}"'  # NeMo's


def test_a_changed_default_changes_the_table():
    # The check has teeth: the same README against a schema whose default differs is not clean.
    tool = load_tool()
    text = (ROOT / "recipes" / "README.md").read_text()
    changed = schema()
    for f in changed["pretraining"] + changed["prompt_learning"] + changed["finetuning"]:
        if f["field"] == "model.optim.sched.warmup_steps":
            f["default"] = str(int(f["default"]) + 1)
    regenerated, dropped = tool.regenerate(text, changed)
    assert regenerated != text and not dropped
    unchanged, _ = tool.regenerate(text, schema())
    assert unchanged == text
