"""torch.autograd.gradcheck of every differentiable loom op in float64 on CPU: the
backward kernels (and the regenerated dropout masks) against finite differences."""
import torch

from test_ops_lib import L


def _rand(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


def test_layer_norm_gradcheck():
    x, w, b = _rand(3, 5, 16, seed=1) * 2 + 1, _rand(16, seed=2), _rand(16, seed=3)
    x = x.detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w, b: L.layer_norm(x, w, b, 1e-5)[0], (x, w, b))


def test_dropout_gradcheck():
    x = _rand(4, 3, 10, seed=4)
    assert torch.autograd.gradcheck(lambda x: L.dropout(x, 0.4, 11, 12, [8, 3, 10], [2, 0, 0]), (x,))


def test_bias_dropout_add_gradcheck():
    x, b, r = _rand(6, 2, 12, seed=5), _rand(12, seed=6), _rand(6, 2, 12, seed=7)
    assert torch.autograd.gradcheck(
        lambda x, b, r: L.bias_dropout_add(x, b, r, 0.25, 3, 4, [], []), (x, b, r))


def test_scaled_masked_softmax_gradcheck():
    x = _rand(2, 2, 5, 7, seed=8)
    mask = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(9)) < 0.3
    assert torch.autograd.gradcheck(lambda x: L.scaled_masked_softmax(x, mask, 0.6, True), (x,))
    assert torch.autograd.gradcheck(lambda x: L.scaled_masked_softmax(x, None, 1.3, False), (x,))


def test_core_attention_gradcheck():
    q, k, v = _rand(2, 2, 4, 3, seed=10), _rand(2, 2, 6, 3, seed=11), _rand(2, 2, 6, 5, seed=12)
    assert torch.autograd.gradcheck(
        lambda q, k, v: L.core_attention(q, k, v, None, 0.5, True, 0.3, 5, 6, [4, 2, 4, 6], [1, 0, 0, 0]),
        (q, k, v))


def test_bias_gelu_gradcheck():
    x, b = _rand(5, 9, seed=13), _rand(9, seed=14)
    assert torch.autograd.gradcheck(lambda x, b: L.bias_gelu(x, b), (x, b))


def test_rms_norm_gradcheck():
    x, w = (_rand(3, 5, 16, seed=15) * 2 + 1).detach().requires_grad_(), _rand(16, seed=16)
    assert torch.autograd.gradcheck(lambda x, w: L.rms_norm(x, w, 1e-6)[0], (x, w))


def test_rotary_gradcheck():
    # Partial rotary (6 of 10) with tables whose halves differ: the general transpose.
    x = _rand(2, 3, 4, 10, seed=17)
    cos, sin = _rand(2, 1, 4, 6, seed=18).detach(), _rand(2, 1, 4, 6, seed=19).detach()
    assert torch.autograd.gradcheck(lambda x: L.rotary(x, cos, sin), (x,))


def test_swiglu_gradcheck():
    x = _rand(4, 3, 14, seed=20)
    assert torch.autograd.gradcheck(lambda x: L.swiglu(x), (x,))
