// CPU kernels of the `loom` ops (schemas: ../schemas.cpp).
#include <torch/library.h>

#include "kernels.h"
#include "paged_attention.h"

TORCH_LIBRARY_IMPL(loom, CPU, m) {
  m.impl("layer_norm", &loom::ops::layer_norm_cpu);
  m.impl("layer_norm_backward", &loom::ops::layer_norm_backward_cpu);
  m.impl("dropout", &loom::ops::dropout_cpu);
  m.impl("dropout_mask", &loom::ops::dropout_mask_cpu);
  m.impl("bias_dropout_add", &loom::ops::bias_dropout_add_cpu);
  m.impl("scaled_masked_softmax", &loom::ops::scaled_masked_softmax_cpu);
  m.impl("scaled_masked_softmax_backward", &loom::ops::scaled_masked_softmax_backward_cpu);
  m.impl("paged_attention", &loom::ops::paged_attention_cpu);
  m.impl("bias_gelu", &loom::ops::bias_gelu_cpu);
  m.impl("bias_gelu_backward", &loom::ops::bias_gelu_backward_cpu);
  m.impl("rms_norm", &loom::ops::rms_norm_cpu);
  m.impl("rms_norm_backward", &loom::ops::rms_norm_backward_cpu);
  m.impl("rotary", &loom::ops::rotary_cpu);
  m.impl("rotary_backward", &loom::ops::rotary_backward_cpu);
  m.impl("swiglu", &loom::ops::swiglu_cpu);
  m.impl("swiglu_backward", &loom::ops::swiglu_backward_cpu);
}
