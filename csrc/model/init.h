// Initialisation for layout equivalence (docs/design/parallel_layout.md, "Initialisation for
// equivalence"): every parameter's *full* tensor is drawn from a generator seeded by
// (seed, parameter name), then sliced for this rank. Any tensor/pipeline layout, and any
// stage holding any range of layers, therefore starts from exactly the same model.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::model {

/// N(0, std²) float32 CPU tensor of `shape`, a pure function of (seed, name, shape); an
/// uninitialised meta tensor of that shape while a ShapesOnlyInit is alive on this thread.
at::Tensor full_normal(uint64_t seed, const std::string& name, const std::vector<int64_t>& shape,
                       double std);

/// U(low, high) float32 CPU tensor of `shape`, a pure function of (seed, name, shape), like
/// full_normal (PyTorch's default init of linear and LSTM weights is uniform).
at::Tensor full_uniform(uint64_t seed, const std::string& name, const std::vector<int64_t>& shape,
                        double low, double high);

/// While alive on this thread, full_normal draws nothing and returns meta tensors, so a model
/// built on the meta device costs no memory (GptStage does this for device meta; used to check
/// the shapes and parameter counts of models far too large for the machine, e.g. GPT-3 175B).
class ShapesOnlyInit {
 public:
  ShapesOnlyInit();
  ~ShapesOnlyInit();
  ShapesOnlyInit(const ShapesOnlyInit&) = delete;
  ShapesOnlyInit& operator=(const ShapesOnlyInit&) = delete;

 private:
  bool previous_;
};

/// While alive on this thread, full_normal and full_uniform draw nothing (they return meta
/// tensors, as under ShapesOnlyInit) and make_parameter gives such a value uninitialised storage
/// on its target device. For a model every parameter of which is overwritten right after it is
/// built: inference loading a checkpoint (generate/model_loader.h). Values made otherwise
/// (LayerNorm ones, zero biases) are made as usual; training never uses this, so its initial
/// values and their reproducibility are untouched.
class SkipInitialValues {
 public:
  SkipInitialValues();
  ~SkipInitialValues();
  SkipInitialValues(const SkipInitialValues&) = delete;
  SkipInitialValues& operator=(const SkipInitialValues&) = delete;

 private:
  bool previous_;
};

/// Rank `rank`'s contiguous 1/size slice of `full` along `dim` (clone, contiguous).
/// Throws std::invalid_argument when the dimension does not divide.
at::Tensor shard(const at::Tensor& full, int64_t dim, int rank, int size);

/// A leaf parameter (requires_grad) holding `value` converted to `options` (uninitialised, of
/// value's shape, for a meta `value` while a SkipInitialValues is alive and `options` are not meta).
at::Tensor make_parameter(const at::Tensor& value, const at::TensorOptions& options);

}  // namespace loom::model
