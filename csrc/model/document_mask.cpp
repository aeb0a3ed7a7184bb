#include "model/document_mask.h"

#include <ATen/ATen.h>

#include <limits>
#include <stdexcept>

namespace loom::model {

at::Tensor cross_segment_mask(const at::Tensor& segment_ids) {
  if (!segment_ids.defined() || segment_ids.dim() != 2 ||
      !at::isIntegralType(segment_ids.scalar_type(), /*includeBool=*/false))
    throw std::invalid_argument("segment_ids: expected an integer tensor [b, s] (the example of each position), found " +
                                (segment_ids.defined() ? c10::str(segment_ids.scalar_type(), " ", segment_ids.sizes())
                                                       : std::string("an undefined tensor")));
  return segment_ids.unsqueeze(2).ne(segment_ids.unsqueeze(1)).unsqueeze(1);
}

at::Tensor sdpa_document_bias(const at::Tensor& cross_segment, at::ScalarType dtype) {
  const int64_t s = cross_segment.size(-1);
  const at::Tensor later = at::ones({s, s}, cross_segment.options()).triu(1);  // key after query
  const at::Tensor hidden = cross_segment.logical_or(later);
  return at::zeros(hidden.sizes(), cross_segment.options().dtype(dtype))
      .masked_fill_(hidden, -std::numeric_limits<double>::infinity());
}

DocumentMask document_mask(const at::Tensor& segment_ids, bool with_sdpa_bias, at::ScalarType dtype) {
  DocumentMask m;
  m.cross_segment = cross_segment_mask(segment_ids);
  if (with_sdpa_bias) m.sdpa_bias = sdpa_document_bias(m.cross_segment, dtype);
  return m;
}

}  // namespace loom::model
