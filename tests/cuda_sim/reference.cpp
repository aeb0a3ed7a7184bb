// Reference results from Loom's CPU kernels (loom_ops/ops.h on CPU tensors) and ATen.
#include "reference.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <limits>

#include "loom_ops/ops.h"
#include "loom_ops/paged_attention.h"

namespace loom::cuda_test {
namespace {

at::ScalarType scalar_type(RefType t) {
  switch (t) {
    case RefType::kFloat: return at::kFloat;
    case RefType::kBFloat16: return at::kBFloat16;
    case RefType::kHalf: return at::kHalf;
  }
  return at::kFloat;
}

// host: the references run on CPU tensors.
at::Tensor tensor(const std::vector<float>& v, at::IntArrayRef shape, at::ScalarType st) {
  return at::tensor(v, at::TensorOptions().dtype(at::kFloat)).reshape(shape).to(st);
}

std::vector<float> values(const at::Tensor& t) {
  const at::Tensor f = t.detach().to(at::kFloat).contiguous();
  return std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
}

}  // namespace

const char* impl_name(RefImpl impl) { return impl == RefImpl::kLoomCpu ? "Loom CPU" : "ATen"; }

LayerNormRef layer_norm_ref(RefImpl impl, RefType t, const std::vector<float>& x,
                            const std::vector<float>& gamma, const std::vector<float>& beta,
                            int64_t rows, int64_t cols, float eps) {
  const at::Tensor xt = tensor(x, {rows, cols}, scalar_type(t));
  const at::Tensor g = tensor(gamma, {cols}, at::kFloat), b = tensor(beta, {cols}, at::kFloat);
  if (impl == RefImpl::kLoomCpu) {
    auto [y, mean, rstd] = ops::layer_norm_with_stats(xt, g, b, eps);
    return {values(y), values(mean), values(rstd)};
  }
  // ATen: fp32 statistics of the same element values; output rounded to the element type.
  auto [y, mean, rstd] = at::native_layer_norm(xt.to(at::kFloat), {cols}, g, b, eps);
  return {values(y.to(scalar_type(t))), values(mean), values(rstd)};
}

LayerNormGradRef layer_norm_backward_ref(RefImpl impl, RefType t, const std::vector<float>& dy,
                                         const std::vector<float>& x,
                                         const std::vector<float>& gamma,
                                         const std::vector<float>& mean,
                                         const std::vector<float>& rstd, int64_t rows,
                                         int64_t cols) {
  const at::ScalarType st = scalar_type(t);
  const at::Tensor dyt = tensor(dy, {rows, cols}, st), xt = tensor(x, {rows, cols}, st);
  const at::Tensor g = tensor(gamma, {cols}, at::kFloat);
  const at::Tensor m = tensor(mean, {rows}, at::kFloat), r = tensor(rstd, {rows}, at::kFloat);
  if (impl == RefImpl::kLoomCpu) {
    auto [dx, dg, db] = ops::layer_norm_backward(dyt, xt, g, m, r);
    return {values(dx), values(dg), values(db)};
  }
  auto [dx, dg, db] = at::native_layer_norm_backward(
      dyt.to(at::kFloat), xt.to(at::kFloat), {cols}, m.reshape({rows, 1}), r.reshape({rows, 1}),
      g, at::zeros_like(g), {true, true, true});
  return {values(dx.to(st)), values(dg), values(db)};
}

std::vector<float> softmax_ref(RefImpl impl, RefType t, const std::vector<float>& x,
                               const std::vector<uint8_t>& mask, int64_t b, int64_t a,
                               int64_t sq, int64_t sk, float scale, bool causal) {
  const at::ScalarType st = scalar_type(t);
  const at::Tensor xt = tensor(x, {b, a, sq, sk}, st);
  std::optional<at::Tensor> m;
  if (!mask.empty())
    m = at::tensor(std::vector<int64_t>(mask.begin(), mask.end()), at::kLong)
            .reshape({b, 1, sq, sk})
            .to(at::kBool);
  if (impl == RefImpl::kLoomCpu) return values(ops::scaled_masked_softmax(xt, m, scale, causal));
  at::Tensor s = xt.to(at::kFloat) * scale;
  at::Tensor masked = at::zeros({b, 1, sq, sk}, at::kBool);
  if (m) masked = masked | *m;
  if (causal) {
    // key j masked for query i when j > i + (sk - sq)
    const at::Tensor i = at::arange(sq, at::kLong).reshape({sq, 1});
    const at::Tensor j = at::arange(sk, at::kLong).reshape({1, sk});
    masked = masked | (j > i + (sk - sq));
  }
  s = s.masked_fill(masked, -std::numeric_limits<float>::infinity());
  at::Tensor y = at::softmax(s, -1);
  y = y.masked_fill(masked.all(-1, true), 0.0);  // fully masked rows: zeros, not NaN
  return values(y.to(st));
}

std::vector<float> paged_attention_ref(RefImpl impl, RefType t, const std::vector<float>& q,
                                       const std::vector<float>& keys, const std::vector<float>& vals,
                                       const std::vector<int64_t>& tables, const std::vector<int64_t>& lens,
                                       int64_t b, int64_t heads, int64_t n, int64_t d, int64_t num_blocks,
                                       int64_t kv_heads, int64_t block_size, float scale,
                                       const std::vector<int64_t>& starts) {
  const at::ScalarType st = scalar_type(t);
  const int64_t max_blocks = static_cast<int64_t>(tables.size()) / b;
  const bool flat = !starts.empty();
  const at::Tensor qt = tensor(q, {flat ? 1 : b, heads, n, d}, st);
  const at::Tensor kt = tensor(keys, {num_blocks, kv_heads, block_size, d}, st);
  const at::Tensor vt = tensor(vals, {num_blocks, kv_heads, block_size, d}, st);
  const at::Tensor tt = at::tensor(tables, at::kLong).reshape({b, max_blocks});
  const at::Tensor lt = at::tensor(lens, at::kLong);
  const std::optional<at::Tensor> st_starts =
      flat ? std::optional<at::Tensor>(at::tensor(starts, at::kLong)) : std::nullopt;
  if (impl == RefImpl::kLoomCpu) return values(ops::paged_attention(qt, kt, vt, tt, lt, scale, st_starts));
  std::vector<at::Tensor> rows;
  for (int64_t r = 0; r < b; ++r) {
    const int64_t nr = flat ? starts[static_cast<size_t>(r + 1)] - starts[static_cast<size_t>(r)] : n;
    const at::Tensor qr = flat ? qt[0].narrow(1, starts[static_cast<size_t>(r)], nr) : qt[r];  // [heads, nr, d]
    const int64_t len = lens[static_cast<size_t>(r)], used = (len + block_size - 1) / block_size;
    const at::Tensor ids = tt[r].narrow(0, 0, used);
    auto gather = [&](const at::Tensor& cache) {  // [heads, len, d] in fp32
      return cache.index_select(0, ids).permute({1, 0, 2, 3}).reshape({kv_heads, used * block_size, d})
          .narrow(1, 0, len).repeat_interleave(heads / kv_heads, 0).to(at::kFloat);
    };
    at::Tensor s = at::matmul(qr.to(at::kFloat), gather(kt).transpose(-2, -1)) * scale;  // [heads, nr, len]
    s = s.masked_fill(at::ones({nr, len}, at::kBool).triu(len - nr + 1), -std::numeric_limits<float>::infinity());
    rows.push_back(at::matmul(at::softmax(s, -1), gather(vt)));
  }
  return values((flat ? at::cat(rows, 1).unsqueeze(0) : at::stack(rows)).to(st));
}

std::vector<float> softmax_backward_ref(RefImpl impl, RefType t, const std::vector<float>& dy,
                                        const std::vector<float>& y, int64_t rows, int64_t sk,
                                        float scale) {
  const at::ScalarType st = scalar_type(t);
  const at::Tensor dyt = tensor(dy, {rows, sk}, st), yt = tensor(y, {rows, sk}, st);
  if (impl == RefImpl::kLoomCpu) return values(ops::scaled_masked_softmax_backward(dyt, yt, scale));
  const at::Tensor dx = at::_softmax_backward_data(dyt.to(at::kFloat), yt.to(at::kFloat), -1,
                                                   at::kFloat) *
                        scale;
  return values(dx.to(st));
}

std::vector<float> bias_gelu_ref(RefImpl impl, RefType t, const std::vector<float>& dy,
                                 const std::vector<float>& x, const std::vector<float>& bias,
                                 int64_t rows, int64_t cols) {
  const at::ScalarType st = scalar_type(t);
  const at::Tensor xt = tensor(x, {rows, cols}, st), b = tensor(bias, {cols}, at::kFloat);
  const bool backward = !dy.empty();
  if (impl == RefImpl::kLoomCpu) {
    if (!backward) return values(ops::bias_gelu(xt, b));
    return values(ops::bias_gelu_backward(tensor(dy, {rows, cols}, st), xt, b));
  }
  const at::Tensor u = xt.to(at::kFloat) + b;
  if (!backward) return values(at::gelu(u, "tanh").to(st));
  return values(at::gelu_backward(tensor(dy, {rows, cols}, st).to(at::kFloat), u, "tanh").to(st));
}

RmsNormRef rms_norm_ref(RefImpl impl, RefType t, const std::vector<float>& x,
                        const std::vector<float>& gamma, int64_t rows, int64_t cols, float eps) {
  const at::Tensor xt = tensor(x, {rows, cols}, scalar_type(t)), g = tensor(gamma, {cols}, at::kFloat);
  if (impl == RefImpl::kLoomCpu) {
    auto [y, rstd] = ops::rms_norm_with_rstd(xt, g, eps);
    return {values(y), values(rstd)};
  }
  const at::Tensor x32 = xt.to(at::kFloat);
  const at::Tensor rstd = (x32.pow(2).mean(-1, true) + eps).rsqrt();
  return {values((x32 * rstd * g).to(scalar_type(t))), values(rstd)};
}

RmsNormGradRef rms_norm_backward_ref(RefImpl impl, RefType t, const std::vector<float>& dy,
                                     const std::vector<float>& x, const std::vector<float>& gamma,
                                     const std::vector<float>& rstd, int64_t rows, int64_t cols) {
  const at::ScalarType st = scalar_type(t);
  const at::Tensor dyt = tensor(dy, {rows, cols}, st), xt = tensor(x, {rows, cols}, st);
  const at::Tensor g = tensor(gamma, {cols}, at::kFloat), r = tensor(rstd, {rows}, at::kFloat);
  if (impl == RefImpl::kLoomCpu) {
    auto [dx, dg] = ops::rms_norm_backward(dyt, xt, g, r);
    return {values(dx), values(dg)};
  }
  // ATen: the closed form from the saved rstd in fp32, xhat = x rstd, gd = dy gamma:
  // dx = rstd (gd − xhat · mean(gd · xhat)), dgamma = Σ dy · xhat.
  const at::Tensor r2 = r.reshape({rows, 1});
  const at::Tensor xhat = xt.to(at::kFloat) * r2, gd = dyt.to(at::kFloat) * g;
  const at::Tensor dx = r2 * (gd - xhat * (gd * xhat).mean(-1, true));
  return {values(dx.to(st)), values((dyt.to(at::kFloat) * xhat).sum(0))};
}

std::vector<float> rotary_ref(RefImpl impl, RefType t, const std::vector<float>& x,
                              const std::vector<float>& cos, const std::vector<float>& sin,
                              int64_t b, int64_t heads, int64_t s, int64_t d, int64_t r,
                              int64_t tb, bool backward) {
  const at::ScalarType st = scalar_type(t);
  const at::Tensor xt = tensor(x, {b, heads, s, d}, st);
  const at::Tensor ct = tensor(cos, {tb, 1, s, r}, st), snt = tensor(sin, {tb, 1, s, r}, st);
  if (impl == RefImpl::kLoomCpu)
    return values(backward ? ops::rotary_backward(xt, ct, snt) : ops::rotary(xt, ct, snt));
  // ATen: the rotate-half composition in fp32; its input gradient through autograd.
  const int64_t half = r / 2;
  const at::Tensor c32 = ct.to(at::kFloat), s32 = snt.to(at::kFloat);
  auto forward = [&](const at::Tensor& v) {
    const at::Tensor vr = v.narrow(-1, 0, r);
    const at::Tensor rotated = at::cat({vr.narrow(-1, half, half).neg(), vr.narrow(-1, 0, half)}, -1);
    return at::cat({vr * c32 + rotated * s32, v.narrow(-1, r, d - r)}, -1);
  };
  if (!backward) return values(forward(xt.to(at::kFloat)).to(st));
  const at::Tensor probe = at::zeros({b, heads, s, d}, at::kFloat).requires_grad_();  // host: reference
  const at::Tensor grad = torch::autograd::grad({forward(probe)}, {probe}, {xt.to(at::kFloat)})[0];
  return values(grad.to(st));
}

std::vector<float> swiglu_ref(RefImpl impl, RefType t, const std::vector<float>& dy,
                              const std::vector<float>& x, int64_t rows, int64_t f) {
  const at::ScalarType st = scalar_type(t);
  const at::Tensor xt = tensor(x, {rows, 2 * f}, st);
  const bool backward = !dy.empty();
  if (impl == RefImpl::kLoomCpu) {
    if (!backward) return values(ops::swiglu(xt));
    return values(ops::swiglu_backward(tensor(dy, {rows, f}, st), xt));
  }
  const at::Tensor x32 = xt.to(at::kFloat).requires_grad_();
  const at::Tensor h = x32.unflatten(-1, {f, 2});
  const at::Tensor y = at::silu(h.select(-1, 0)) * h.select(-1, 1);
  if (!backward) return values(y.to(st));
  return values(torch::autograd::grad({y}, {x32}, {tensor(dy, {rows, f}, st).to(at::kFloat)})[0].to(st));
}

std::vector<float> loom_cpu_dropout(RefType t, const std::vector<float>& x,
                                    const std::vector<float>& bias,
                                    const std::vector<float>& residual,
                                    const std::vector<int64_t>& local,
                                    const std::vector<int64_t>& global,
                                    const std::vector<int64_t>& offset, double p, uint64_t seed,
                                    uint64_t stream) {
  const at::ScalarType st = scalar_type(t);
  ops::DropoutSpec spec;
  spec.p = p;
  spec.key = {seed, stream};
  spec.block = {global, offset};
  const at::Tensor xt = tensor(x, local, st);
  if (residual.empty()) return values(ops::dropout(xt, spec));
  std::optional<at::Tensor> b;
  if (!bias.empty()) b = tensor(bias, {local.back()}, at::kFloat);
  return values(ops::bias_dropout_add(xt, b, tensor(residual, local, st), spec));
}

std::vector<uint8_t> loom_cpu_dropout_mask(const std::vector<int64_t>& local,
                                           const std::vector<int64_t>& global,
                                           const std::vector<int64_t>& offset, double p,
                                           uint64_t seed, uint64_t stream) {
  ops::DropoutSpec spec;
  spec.p = p;
  spec.key = {seed, stream};
  spec.block = {global, offset};
  const at::Tensor m = ops::dropout_keep_mask(at::empty(local, at::kFloat), spec)
                           .to(at::kByte)
                           .contiguous();
  return std::vector<uint8_t>(m.data_ptr<uint8_t>(), m.data_ptr<uint8_t>() + m.numel());
}

}  // namespace loom::cuda_test
