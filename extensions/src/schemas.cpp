// Every schema of the `loom` op library, in one place. Implementations are registered per
// dispatch key elsewhere: cpu/register_cpu.cpp (CPU), cuda/ops_cuda.cpp (CUDA),
// meta.cpp (Meta: shapes only), autograd.cpp (Autograd), attention.cpp
// (CompositeExplicitAutograd: core_attention is a composition of the ops below).
// paged_attention (inference only, no autograd) reads keys and values through block tables;
// its checks are in paged_attention.cpp.
//
// Dropout arguments (p, seed, stream, global_shape, offset) follow philox.h and
// dropout_layout.h: the input is the block `offset` of a row-major tensor of shape
// `global_shape` (both [] = the input is the whole tensor); seed and stream are 64-bit
// patterns carried in int (int64).
#include <torch/library.h>

TORCH_LIBRARY(loom, m) {
  m.def("layer_norm(Tensor input, Tensor weight, Tensor bias, float eps)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_backward(Tensor grad_out, Tensor input, Tensor weight, Tensor mean,"
        " Tensor rstd) -> (Tensor, Tensor, Tensor)");
  m.def("dropout(Tensor input, float p, int seed, int stream, int[] global_shape,"
        " int[] offset) -> Tensor");
  m.def("dropout_mask(Tensor like, float p, int seed, int stream, int[] global_shape,"
        " int[] offset) -> Tensor");
  m.def("bias_dropout_add(Tensor input, Tensor? bias, Tensor residual, float p, int seed,"
        " int stream, int[] global_shape, int[] offset) -> Tensor");
  m.def("scaled_masked_softmax(Tensor input, Tensor? mask, float scale, bool causal)"
        " -> Tensor");
  m.def("scaled_masked_softmax_backward(Tensor grad_out, Tensor output, float scale)"
        " -> Tensor");
  m.def("core_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale,"
        " bool causal, float p, int seed, int stream, int[] global_shape, int[] offset)"
        " -> Tensor");
  m.def("core_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v,"
        " Tensor? mask, float scale, bool causal, float p, int seed, int stream,"
        " int[] global_shape, int[] offset) -> (Tensor, Tensor, Tensor)");
  m.def("paged_attention(Tensor q, Tensor key_cache, Tensor value_cache, Tensor block_tables,"
        " Tensor context_lens, float scale, Tensor? query_starts=None) -> Tensor");
  m.def("bias_gelu(Tensor input, Tensor bias) -> Tensor");
  m.def("bias_gelu_backward(Tensor grad_out, Tensor input, Tensor bias) -> Tensor");
  // The Llama family's ops (docs/design/llama.md): RMSNorm, rotate-half RoPE from the model's
  // cos/sin tables, SwiGLU on Loom's interleaved [gate, up] pairs (csrc/model/mlp.h).
  m.def("rms_norm(Tensor input, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rms_norm_backward(Tensor grad_out, Tensor input, Tensor weight, Tensor rstd)"
        " -> (Tensor, Tensor)");
  m.def("rotary(Tensor input, Tensor cos, Tensor sin) -> Tensor");
  m.def("rotary_backward(Tensor grad_out, Tensor cos, Tensor sin) -> Tensor");
  m.def("swiglu(Tensor input) -> Tensor");
  m.def("swiglu_backward(Tensor grad_out, Tensor input) -> Tensor");
}
