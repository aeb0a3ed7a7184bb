"""Every loom op against a composition of torch ops, forward and backward, on each device
(cpu, and cuda when present) in float32, bfloat16 (and float16 on cuda). The reference is
computed in float32 from the same rounded inputs; loom accumulates in float32 and rounds
once, so reduced-precision results sit within a few bf16/fp16 ulps (2^-8 / 2^-11
relative) of it. Shapes use a hidden size that is a multiple of 8 (the 16-byte vector
path of the CUDA kernels) and one that is not (the element path)."""
import pytest
import torch

from test_ops_lib import DEVICES, L

DTYPES = [torch.float32, torch.bfloat16]


def _cases():
    for device in DEVICES:
        for dtype in DTYPES + ([torch.float16] if device == "cuda" else []):
            yield device, dtype


CASES = list(_cases())


def tol(dtype, scale=1.0):
    """(rtol, atol): fp32 reassociation ~1e-5; bf16 2^-8, fp16 2^-10 relative, scaled for
    results that sum many rounded terms."""
    if dtype == torch.float32:
        return 1e-5 * scale, 1e-5 * scale
    eps = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -10
    return eps * scale, eps * scale


def close(a, b, rtol, atol):
    torch.testing.assert_close(a.float(), b.float(), rtol=rtol, atol=atol)


def rand(shape, dtype, device, seed, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale + shift).to(device=device, dtype=dtype)


def leaf(t):
    return t.detach().clone().float().requires_grad_()


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("h", [1024, 200, 13])
def test_layer_norm(device, dtype, h):
    x, w, b = rand((8, 3, h), dtype, device, 1, 2.0, 0.7), rand((h,), dtype, device, 2, 0.3, 1.0), \
        rand((h,), dtype, device, 3)
    dy = rand((8, 3, h), dtype, device, 4)
    xs, ws, bs = [t.clone().requires_grad_() for t in (x, w, b)]
    y, mean, rstd = L.layer_norm(xs, ws, bs, 1e-5)
    y.backward(dy)
    xr, wr, br = leaf(x), leaf(w), leaf(b)
    yr = torch.nn.functional.layer_norm(xr, (h,), wr, br, 1e-5)
    yr.backward(dy.float())
    rtol, atol = tol(dtype, 4)
    close(y, yr, rtol, atol)
    close(mean, x.float().mean(-1), 1e-5, 1e-5)
    close(rstd, torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5), 1e-4, 1e-5)
    close(xs.grad, xr.grad, *tol(dtype, 8))
    # parameter grads sum 24 rows
    close(ws.grad, wr.grad, *tol(dtype, 16))
    close(bs.grad, br.grad, *tol(dtype, 16))


@pytest.mark.parametrize("device,dtype", CASES)
def test_layer_norm_float32_parameters(device, dtype):
    x = rand((16, 96), dtype, device, 5, 1.5)
    w, b = rand((96,), torch.float32, device, 6), rand((96,), torch.float32, device, 7)
    y = L.layer_norm(x, w, b, 1e-6)[0]
    assert y.dtype == dtype
    close(y, torch.nn.functional.layer_norm(x.float(), (96,), w, b, 1e-6), *tol(dtype, 4))


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("h", [256, 30])
def test_bias_dropout_add(device, dtype, h):
    x, bias, res = rand((6, 4, h), dtype, device, 8), rand((h,), dtype, device, 9), \
        rand((6, 4, h), dtype, device, 10)
    p, seed, stream, gshape, off = 0.2, 1234, 77, [12, 4, h], [6, 0, 0]
    xs, bs, rs = [t.clone().requires_grad_() for t in (x, bias, res)]
    out = L.bias_dropout_add(xs, bs, rs, p, seed, stream, gshape, off)
    keep = L.dropout_mask(x, p, seed, stream, gshape, off)
    ref = res.float() + (x.float() + bias.float()) * keep / (1 - p)
    close(out, ref, *tol(dtype, 2))
    dy = rand((6, 4, h), dtype, device, 11)
    out.backward(dy)
    gx = dy.float() * keep / (1 - p)
    close(xs.grad, gx, *tol(dtype, 2))
    close(rs.grad, dy.float(), 0.0, 0.0)
    close(bs.grad, gx.to(dtype).float().sum((0, 1)), *tol(dtype, 16))


@pytest.mark.parametrize("device,dtype", CASES)
def test_dropout(device, dtype):
    x = rand((5, 7, 33), dtype, device, 12)
    y = L.dropout(x, 0.3, 9, 10, [], [])
    keep = L.dropout_mask(x, 0.3, 9, 10, [], [])
    close(y, x.float() * keep / 0.7, *tol(dtype, 2))
    assert torch.equal(L.dropout(x, 0.0, 9, 10, [], []), x)
    assert not L.dropout(x, 1.0, 9, 10, [], []).any()


def _softmax_ref(x, masked, scale):
    s = (x.float() * scale).masked_fill(masked, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("sq,sk", [(16, 16), (5, 11), (64, 2056)])
def test_scaled_masked_softmax(device, dtype, sq, sk):
    b, a, scale = 2, 3, 0.125
    x = rand((b, a, sq, sk), dtype, device, 13, 3.0)
    dy = rand((b, a, sq, sk), dtype, device, 14)
    g = torch.Generator().manual_seed(15)
    mask = (torch.rand(b, 1, sq, sk, generator=g) < 0.25).to(device)
    mask[0, 0, 1] = True  # a fully masked row -> zeros
    causal_masked = torch.ones(sq, sk, dtype=torch.bool, device=device).triu(sk - sq + 1)
    for m, causal in [(None, True), (mask, False), (mask, True)]:
        masked = torch.zeros(b, a, sq, sk, dtype=torch.bool, device=device)
        if causal:
            masked = masked | causal_masked
        if m is not None:
            masked = masked | m
        xs = x.clone().requires_grad_()
        y = L.scaled_masked_softmax(xs, m, scale, causal)
        y.backward(dy)
        xr = leaf(x)
        yr = _softmax_ref(xr, masked, scale)
        yr.backward(dy.float())
        close(y, yr, *tol(dtype, 2))
        close(xs.grad, xr.grad, *tol(dtype, 4))


@pytest.mark.parametrize("device,dtype", CASES)
def test_core_attention(device, dtype):
    b, a, s, d, p, scale = 2, 4, 32, 16, 0.1, 0.25
    q, k, v = (rand((b, a, s, d), dtype, device, 16 + i) for i in range(3))
    dy = rand((b, a, s, d), dtype, device, 19)
    qs, ks, vs = [t.clone().requires_grad_() for t in (q, k, v)]
    out = L.core_attention(qs, ks, vs, None, scale, True, p, 5, 6, [], [])
    out.backward(dy)
    keep = L.dropout_mask(torch.empty(b, a, s, s, device=device), p, 5, 6, [], [])
    qr, kr, vr = leaf(q), leaf(k), leaf(v)
    sc = (qr @ kr.transpose(-2, -1) * scale).masked_fill(
        torch.ones(s, s, dtype=torch.bool, device=device).triu(1), float("-inf"))
    ref = (torch.softmax(sc, -1) * keep / (1 - p)) @ vr
    ref.backward(dy.float())
    # GEMM inputs/outputs are rounded in reduced precision (scores, probabilities).
    rt, at = tol(dtype, 10 if dtype == torch.float32 else 12)
    close(out, ref, rt, at)
    for got, want in [(qs.grad, qr.grad), (ks.grad, kr.grad), (vs.grad, vr.grad)]:
        close(got, want, rt, at)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("f", [512, 36])
def test_bias_gelu(device, dtype, f):
    x, bias, dy = rand((9, 2, f), dtype, device, 20, 2.0), rand((f,), dtype, device, 21), \
        rand((9, 2, f), dtype, device, 22)
    xs, bs = x.clone().requires_grad_(), bias.clone().requires_grad_()
    y = L.bias_gelu(xs, bs)
    y.backward(dy)
    xr, br = leaf(x), leaf(bias)
    yr = torch.nn.functional.gelu(xr + br, approximate="tanh")
    yr.backward(dy.float())
    close(y, yr, *tol(dtype, 2))
    close(xs.grad, xr.grad, *tol(dtype, 2))
    close(bs.grad, br.grad, *tol(dtype, 16))


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("h", [1024, 13])
def test_rms_norm(device, dtype, h):
    x, w, dy = rand((7, 3, h), dtype, device, 23, 2.0, 0.5), rand((h,), dtype, device, 24, 0.3, 1.0), \
        rand((7, 3, h), dtype, device, 25)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = L.rms_norm(xs, ws, 1e-6)[0]
    y.backward(dy)
    xr, wr = leaf(x), leaf(w)
    yr = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * wr
    yr.backward(dy.float())
    close(y, yr, *tol(dtype, 2))
    close(xs.grad, xr.grad, *tol(dtype, 4))
    close(ws.grad, wr.grad, *tol(dtype, 32))


def _rotate_half_reference(x, cos, sin):
    r = cos.shape[-1]
    x1, x2, rest = x[..., :r // 2], x[..., r // 2:r], x[..., r:]
    return torch.cat([x[..., :r] * cos + torch.cat([-x2, x1], -1) * sin, rest], -1)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("d,r", [(16, 16), (10, 6)])
def test_rotary(device, dtype, d, r):
    # x: the K heads of a [s, b, groups, 3d] projection viewed as [b, groups, s, d] (strided).
    mixed = rand((5, 2, 3, 3 * d), dtype, device, 26)
    x = mixed[..., d:2 * d].permute(1, 2, 0, 3)
    pos = torch.arange(5, dtype=torch.float32).expand(2, 5)
    ang = pos[..., None] * (100.0 ** (-torch.arange(0, r, 2, dtype=torch.float32) / r))
    both = torch.cat([ang, ang], -1)[:, None].to(device)
    cos, sin = both.cos().to(dtype), both.sin().to(dtype)
    dy = rand((2, 3, 5, d), dtype, device, 27)
    xs = x.detach().requires_grad_()
    y = L.rotary(xs, cos, sin)
    y.backward(dy)
    xr = leaf(x)
    yr = _rotate_half_reference(xr, cos.float(), sin.float())
    yr.backward(dy.float())
    close(y, yr, *tol(dtype, 2))
    close(xs.grad, xr.grad, *tol(dtype, 2))


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("f", [512, 9])
def test_swiglu(device, dtype, f):
    x, dy = rand((6, 2, 2 * f), dtype, device, 28, 2.0), rand((6, 2, f), dtype, device, 29)
    xs = x.clone().requires_grad_()
    y = L.swiglu(xs)
    y.backward(dy)
    xr = leaf(x)
    pairs = xr.unflatten(-1, (f, 2))
    yr = torch.nn.functional.silu(pairs[..., 0]) * pairs[..., 1]
    yr.backward(dy.float())
    close(y, yr, *tol(dtype, 2))
    close(xs.grad, xr.grad, *tol(dtype, 2))
