"""Loading libloom_ops.so and what every loom op test shares.

The library is found through the environment variable LOOM_OPS_LIB, or at
<repo>/build/lib/libloom_ops.so (the path tools/build.sh produces). Devices tested: cpu,
plus cuda when torch sees a GPU; LOOM_OPS_DEVICES="cpu,cuda" overrides (tools/gpu_check.sh
sets it). This file also checks that the library registers every schema and passes
torch.library.opcheck (schema, autograd registration, fake tensors, AOT dispatch).
"""
import os
import pathlib

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
LIB = pathlib.Path(os.environ.get("LOOM_OPS_LIB", REPO / "build" / "lib" / "libloom_ops.so"))

if not LIB.exists():
    raise RuntimeError(
        f"libloom_ops.so not found at {LIB}: build it (tools/build.sh, or cmake -S extensions) "
        "or point LOOM_OPS_LIB at it")
torch.ops.load_library(str(LIB))
L = torch.ops.loom


def _devices():
    env = os.environ.get("LOOM_OPS_DEVICES")
    if env:
        return [d.strip() for d in env.split(",") if d.strip()]
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


DEVICES = _devices()

OPS = ["layer_norm", "layer_norm_backward", "dropout", "dropout_mask", "bias_dropout_add",
       "scaled_masked_softmax", "scaled_masked_softmax_backward", "core_attention",
       "core_attention_backward", "bias_gelu", "bias_gelu_backward", "rms_norm",
       "rms_norm_backward", "rotary", "rotary_backward", "swiglu", "swiglu_backward"]


def test_every_op_is_registered():
    for name in OPS:
        schema = getattr(L, name).default._schema
        assert schema.name == f"loom::{name}"


def _opcheck_cases(device):
    g = torch.Generator().manual_seed(5)

    def rnd(*shape, grad=True):
        t = torch.randn(*shape, generator=g).to(device)
        return t.requires_grad_(grad)

    x, w, b = rnd(4, 8), rnd(8), rnd(8)
    return [
        (L.layer_norm.default, (x, w, b, 1e-5)),
        (L.dropout.default, (x, 0.3, 1, 2, [], [])),
        (L.dropout_mask.default, (rnd(4, 8, grad=False), 0.3, 1, 2, [8, 8], [2, 0])),
        (L.bias_dropout_add.default, (x, b, rnd(4, 8), 0.3, 1, 2, [12, 8], [4, 0])),
        (L.bias_dropout_add.default, (x, None, rnd(4, 8), 0.0, 1, 2, [], [])),
        (L.scaled_masked_softmax.default,
         (rnd(2, 3, 5, 5), (torch.rand(2, 1, 5, 5, generator=g) < 0.3).to(device), 0.5, True)),
        (L.core_attention.default,
         (rnd(2, 3, 5, 4), rnd(2, 3, 5, 4), rnd(2, 3, 5, 4), None, 0.5, True, 0.2, 3, 4, [], [])),
        (L.bias_gelu.default, (x, b)),
        (L.rms_norm.default, (x, w, 1e-6)),
        (L.rotary.default, (rnd(2, 3, 5, 8), rnd(2, 1, 5, 6, grad=False), rnd(2, 1, 5, 6, grad=False))),
        (L.swiglu.default, (rnd(3, 10),)),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    for op, args in _opcheck_cases(device):
        result = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in result.values()), (op, result)
