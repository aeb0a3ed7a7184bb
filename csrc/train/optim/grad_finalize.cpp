#include "train/optim/grad_finalize.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "runtime/coalesced.h"

namespace loom::train::optim {
namespace {

// SUM all-reduces, over `group`, the main grads of the selected parameters (one packed call).
template <typename Pred>
void all_reduce_selected(GradBuffer& grads, runtime::Communicator& group, Pred selected) {
  std::vector<at::Tensor> views;
  for (size_t i = 0; i < grads.params().size(); ++i)
    if (selected(grads.params()[i])) views.push_back(grads.main_grad(i).view(-1));
  runtime::all_reduce_coalesced(views, group);
}

}  // namespace

void reduce_data_parallel_grads(GradBuffer& grads, runtime::Communicator& data, bool reduce_scatter) {
  const int d = data.size();
  if (d == 1) return;
  for (size_t b = 0; b < grads.buckets().size(); ++b) {
    at::Tensor bucket = grads.bucket_view(b);
    bucket.mul_(1.0 / d);
    if (!reduce_scatter) {
      data.all_reduce(bucket);
      continue;
    }
    if (bucket.numel() % d != 0)
      throw std::invalid_argument("reduce-scatter of gradient bucket " + std::to_string(b) + ": " +
                                  std::to_string(bucket.numel()) + " elements are not a multiple of the data-parallel size " +
                                  std::to_string(d) + " (build the GradBuffer with pad_multiple = d)");
    at::Tensor shard = data.reduce_scatter_dim0(bucket);
    const int64_t n = bucket.numel() / d;
    bucket.narrow(0, data.rank() * n, n).copy_(shard);
  }
}

void all_reduce_sequence_parallel_grads(GradBuffer& grads, runtime::Communicator& tensor) {
  all_reduce_selected(grads, tensor, [](const model::Param& p) { return p.sequence_parallel; });
}

void all_reduce_word_embedding_grads(GradBuffer& grads, runtime::Communicator& embedding) {
  all_reduce_selected(grads, embedding, [](const model::Param& p) { return p.word_embedding; });
}

void finalize_grads(GradBuffer& grads, runtime::Communicator& data, runtime::Communicator& tensor,
                    runtime::Communicator& embedding, bool reduce_scatter) {
  if (reduce_scatter) {
    all_reduce_sequence_parallel_grads(grads, tensor);
    all_reduce_word_embedding_grads(grads, embedding);
    reduce_data_parallel_grads(grads, data, true);
    return;
  }
  reduce_data_parallel_grads(grads, data, false);
  all_reduce_sequence_parallel_grads(grads, tensor);
  all_reduce_word_embedding_grads(grads, embedding);
}

}  // namespace loom::train::optim
