// Reference results for the CUDA kernel tests, from Loom's CPU kernels (the op library's CPU
// backend) and from ATen, behind a torch-free interface: values travel as float vectors
// holding exact values of the element type, so the simulator's translation units (and their
// sanitizer build) never include a torch header.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::cuda_test {

enum class RefType { kFloat, kBFloat16, kHalf };
/// Who computes the reference: the op library's CPU kernels, or ATen's own operators.
enum class RefImpl { kLoomCpu, kAten };
const char* impl_name(RefImpl impl);

/// Results are rounded to the element type (statistics and parameter gradients: float32).
struct LayerNormRef {
  std::vector<float> y, mean, rstd;
};
LayerNormRef layer_norm_ref(RefImpl impl, RefType t, const std::vector<float>& x,
                            const std::vector<float>& gamma, const std::vector<float>& beta,
                            int64_t rows, int64_t cols, float eps);

struct LayerNormGradRef {
  std::vector<float> dx, dgamma, dbeta;
};
LayerNormGradRef layer_norm_backward_ref(RefImpl impl, RefType t, const std::vector<float>& dy,
                                         const std::vector<float>& x,
                                         const std::vector<float>& gamma,
                                         const std::vector<float>& mean,
                                         const std::vector<float>& rstd, int64_t rows,
                                         int64_t cols);

/// x [b, a, sq, sk]; mask empty or [b, 1, sq, sk] (1 = masked out).
std::vector<float> softmax_ref(RefImpl impl, RefType t, const std::vector<float>& x,
                               const std::vector<uint8_t>& mask, int64_t b, int64_t a,
                               int64_t sq, int64_t sk, float scale, bool causal);
std::vector<float> softmax_backward_ref(RefImpl impl, RefType t, const std::vector<float>& dy,
                                        const std::vector<float>& y, int64_t rows, int64_t sk,
                                        float scale);

/// dy empty: gelu_tanh(x + bias); else dy * gelu_tanh'(x + bias).
/// Paged attention: q [b, heads, n, d]; key and value caches [num_blocks, kv_heads, bs, d];
/// tables [b, max_blocks] (block ids); lens [b] (positions held, the n new ones included).
/// Loom CPU: loom::paged_attention on CPU tensors; ATen: each row's blocks gathered into
/// contiguous keys, fp32 causal scores, softmax and ×V. With `starts` ([b + 1]) the flat form:
/// q is [1, heads, n, d], row r's queries [starts[r], starts[r + 1]).
std::vector<float> paged_attention_ref(RefImpl impl, RefType t, const std::vector<float>& q,
                                       const std::vector<float>& keys, const std::vector<float>& vals,
                                       const std::vector<int64_t>& tables, const std::vector<int64_t>& lens,
                                       int64_t b, int64_t heads, int64_t n, int64_t d, int64_t num_blocks,
                                       int64_t kv_heads, int64_t block_size, float scale,
                                       const std::vector<int64_t>& starts = {});
std::vector<float> bias_gelu_ref(RefImpl impl, RefType t, const std::vector<float>& dy,
                                 const std::vector<float>& x, const std::vector<float>& bias,
                                 int64_t rows, int64_t cols);

/// RMSNorm: y and rstd (float32) of x [rows, cols] with gamma (float32 [cols]).
struct RmsNormRef {
  std::vector<float> y, rstd;
};
RmsNormRef rms_norm_ref(RefImpl impl, RefType t, const std::vector<float>& x,
                        const std::vector<float>& gamma, int64_t rows, int64_t cols, float eps);
/// dx (element type) and dgamma (float32) of RMSNorm, from the forward's rstd.
struct RmsNormGradRef {
  std::vector<float> dx, dgamma;
};
RmsNormGradRef rms_norm_backward_ref(RefImpl impl, RefType t, const std::vector<float>& dy,
                                     const std::vector<float>& x, const std::vector<float>& gamma,
                                     const std::vector<float>& rstd, int64_t rows, int64_t cols);

/// Rotary of x [b, heads, s, d] (contiguous) with tables cos, sin [tb, 1, s, r] (element
/// type); backward: rotary_backward of x taken as the gradient. Contiguous [b, heads, s, d].
std::vector<float> rotary_ref(RefImpl impl, RefType t, const std::vector<float>& x,
                              const std::vector<float>& cos, const std::vector<float>& sin,
                              int64_t b, int64_t heads, int64_t s, int64_t d, int64_t r,
                              int64_t tb, bool backward);

/// SwiGLU of x [rows, 2f] (interleaved pairs): dy empty: the output [rows, f]; else the input
/// gradient [rows, 2f] of dy [rows, f].
std::vector<float> swiglu_ref(RefImpl impl, RefType t, const std::vector<float>& dy,
                              const std::vector<float>& x, int64_t rows, int64_t f);

/// Loom's CPU dropout of x (local shape `local`, the block at `offset` of `global`):
/// bias and residual empty: dropout(x); else bias_dropout_add(x, bias or none, residual).
std::vector<float> loom_cpu_dropout(RefType t, const std::vector<float>& x,
                                    const std::vector<float>& bias,
                                    const std::vector<float>& residual,
                                    const std::vector<int64_t>& local,
                                    const std::vector<int64_t>& global,
                                    const std::vector<int64_t>& offset, double p, uint64_t seed,
                                    uint64_t stream);
std::vector<uint8_t> loom_cpu_dropout_mask(const std::vector<int64_t>& local,
                                           const std::vector<int64_t>& global,
                                           const std::vector<int64_t>& offset, double p,
                                           uint64_t seed, uint64_t stream);

}  // namespace loom::cuda_test
