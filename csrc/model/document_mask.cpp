#include "model/document_mask.h"

#include <ATen/ATen.h>

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

at::Tensor attending_mask(const at::Tensor& cross_segment) {
  return cross_segment.logical_not().tril();
}

}  // namespace loom::model
