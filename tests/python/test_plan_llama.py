"""The planner on a Llama-family model against the model Loom builds and trains
(docs/planner.md, "Llama-family models"): recipes/llama_tiny.yaml (RMSNorm, RoPE, SwiGLU,
grouped-query attention, no biases, untied output layer) trains one step at several layouts; the
parameters its rank 0 holds ("N parameters on rank 0", counted from the optimizer's tensors) equal
the planner's stage-0 parameters per GPU for the same layout, and the model FLOPs behind the step
log's MFU (model_tflops_per_device x step time x ranks) equal the planner's model FLOPs per step
and the closed form 6·s·(L·W + h·V) + 12·L·s²·h counted here from the shape."""
import re
import subprocess

import pytest

from test_data_helpers import ROOT, loom_binary
from train_helpers import make_corpus, metrics, run_loom

RECIPE = ROOT / "recipes" / "llama_tiny.yaml"
# llama_tiny: L 4, h 128, 4 heads of 32 in 2 groups, SwiGLU 352, s 128, GPT-2 BPE padded to 50304.
L, H, HEADS, GROUPS, FFN, S, V = 4, 128, 4, 2, 352, 128, 50304
D = H // HEADS


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory)


def layout_overrides(t, p, d):
    return [f"trainer.devices={t * p * d}", f"model.tensor_model_parallel_size={t}",
            f"model.pipeline_model_parallel_size={p}", f"model.sequence_parallel={'true' if t > 1 else 'false'}",
            f"model.global_batch_size={2 * 2 * d}", "model.micro_batch_size=2"]


def closed_form_flops_per_sample(t):
    """6 per linear weight per token, 12·L·s²·a·d for the attention scores, the logits GEMM over
    the vocabulary padded for t (a multiple of 128 already: 50304)."""
    weights = H * (HEADS + 2 * GROUPS) * D + HEADS * D * H + 3 * H * FFN
    return 6 * S * (L * weights + H * V) + 12 * L * S * S * HEADS * D


def closed_form_parameters():
    """Everything the model builds: L layers of linear weights and two RMSNorm weights, the word
    embedding, the final norm, the untied output layer (no biases, no position table)."""
    weights = H * (HEADS + 2 * GROUPS) * D + HEADS * D * H + 3 * H * FFN
    return L * (weights + 2 * H) + V * H + H + V * H


def train_and_plan(corpus, tmp_path, t, p, d, shape_overrides=()):
    """Trains one step and plans the same recipe and layout: (parameters on rank 0, the step's
    model FLOPs behind MFU, the planner's parameters per GPU by stage, its model FLOPs per step)."""
    run = tmp_path / "run"
    overrides = layout_overrides(t, p, d) + list(shape_overrides) + [
        "trainer.max_steps=1", "trainer.log_every_n_steps=1", "trainer.val_check_interval=1",
        "trainer.limit_val_batches=0", f"exp_manager.explicit_log_dir={run}",
        "exp_manager.checkpoint_callback_params.every_n_steps=100", f"model.data.data_prefix=[1.0,{corpus}]",
        "model.data.num_workers=0"]
    done = run_loom("train", RECIPE, overrides, timeout=600)
    trained = int(re.search(r"hidden \d+, (\d+) parameters on rank 0", done.stderr)[1])
    record = metrics(run)[-1]
    flops = record["model_tflops_per_device"] * 1e12 * record["step_time_s"] * t * p * d

    plan = subprocess.run(
        [str(loom_binary()), "plan", "--recipe", str(RECIPE), "--gpu", "H100", "trainer.accelerator=gpu",
         *overrides], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr[-4000:]
    assert "rmsnorm rope fast-swiglu no-bias untied" in plan.stderr
    m = re.search(r"parameters per GPU by stage: ([\d, ]+); model FLOPs per step: (\S+)", plan.stderr)
    assert m, plan.stderr[-4000:]
    return trained, flops, [int(x) for x in m[1].split(", ")], float(m[2])


@pytest.mark.parametrize("t,p,d", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (1, 1, 2)])
def test_planner_parameters_and_flops_equal_the_trained_llama(corpus, tmp_path, t, p, d):
    trained, flops, per_stage, planned_flops = train_and_plan(corpus, tmp_path, t, p, d)
    assert len(per_stage) == p
    assert per_stage[0] == trained, (per_stage, trained)
    if t == 1 and p == 1:
        assert trained == closed_form_parameters()
    global_batch = 4 * d
    assert planned_flops == pytest.approx(closed_form_flops_per_sample(t) * global_batch, rel=1e-9)
    assert flops == pytest.approx(planned_flops, rel=1e-9)


def test_planner_counts_qwen2_biases_and_a_narrower_head(corpus, tmp_path):
    """Q/K/V-only biases (model.qkv_bias, split with the projection at t=2) and heads of 16
    instead of hidden / heads = 32 (model.kv_channels): planned = built, and the FLOPs behind
    MFU = the planner's."""
    trained, flops, per_stage, planned_flops = train_and_plan(
        corpus, tmp_path, 2, 1, 1, ["model.qkv_bias=true", "model.kv_channels=16"])
    assert per_stage[0] == trained, (per_stage, trained)
    narrow = 16 * (HEADS + 2 * GROUPS)
    weights = H * narrow + HEADS * 16 * H + 3 * H * FFN
    assert trained == (L * (weights + narrow) // 2 + L * 2 * H + V * H // 2 + H + V * H // 2)
    assert flops == pytest.approx(planned_flops, rel=1e-9)
