// Shared by the pipeline equality tests (fused attention on p = 2, uneven stages): one global
// batch cut into micro-batches of one sample, and a pipeline step's loss and every gradient
// checked against the whole model run in one process on that batch.
#pragma once
#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "model/gpt_stage.h"
#include "train/gpt_step.h"
#include "train/model_setup.h"

namespace loom::test {

inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
}

/// `batch` samples of `seq` random tokens with some masked, as micro-batches of one sample.
struct ReferenceBatch {
  at::Tensor tokens, labels, mask, positions;  // [batch, seq]
  std::vector<train::MicroBatch> micro_batches;
};

inline ReferenceBatch reference_batch(int64_t vocab, int batch, int seq) {
  ReferenceBatch b;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  b.tokens = at::randint(vocab, {batch, seq}, gen, at::kLong);
  b.labels = at::randint(vocab, {batch, seq}, gen, at::kLong);
  b.mask = (at::rand({batch, seq}, gen) > 0.2).to(at::kFloat);
  b.positions = at::arange(seq, at::kLong).unsqueeze(0).expand({batch, seq}).contiguous();
  for (int k = 0; k < batch; ++k) {
    train::MicroBatch mb;
    mb.tokens = b.tokens.slice(0, k, k + 1);
    mb.labels = b.labels.slice(0, k, k + 1);
    mb.loss_mask = b.mask.slice(0, k, k + 1);
    mb.position_ids = b.positions.slice(0, k, k + 1);
    mb.global_row = k;
    b.micro_batches.push_back(mb);
  }
  return b;
}

/// The whole model of `whole_cfg` in one process, the whole batch, the mean loss over unmasked
/// tokens: `loss` (the pipeline step's) must equal it and every gradient of `chunks` its
/// gradient within 1e-5 (relative). With `tied_split` the first and last stages each hold a part
/// of the tied word embedding's gradient: they are summed over the embedding group first.
inline void check_against_whole_model(const std::vector<model::GptStage>& chunks, runtime::ProcessGroups& groups,
                                      const model::GptConfig& whole_cfg, const ReferenceBatch& batch,
                                      const model::DropoutContext& dropout, double loss, bool tied_split,
                                      const std::string& where) {
  model::GptStage whole(whole_cfg, runtime::Communicator::solo());
  model::StageInputs in;
  in.tokens = batch.tokens;
  in.position_ids = batch.positions;
  in.labels = batch.labels;
  at::Tensor want_loss = (whole.forward(in, dropout) * batch.mask).sum() / batch.mask.sum();
  want_loss.backward();
  std::map<std::string, at::Tensor> want;
  for (const auto& param : whole.parameters()) want[param.name] = param.tensor.grad();
  LOOM_WCHECK(std::abs(loss - want_loss.item<double>()) <= 1e-5 * std::abs(want_loss.item<double>()),
              "(loss " + std::to_string(loss) + ", single process " + std::to_string(want_loss.item<double>()) + ")");
  int checked = 0;
  for (const auto& param : train::chunk_parameters(chunks)) {
    at::Tensor g = param.tensor.grad().detach().clone();
    const bool tied = param.word_embedding && tied_split;
    if (tied) groups.embedding().all_reduce(g);
    const std::string name = tied ? "embedding.word_embeddings.weight" : param.name;
    LOOM_WCHECK(want.count(name), "(no reference gradient of " + name + ")");
    const double err = rel_err(g, want[name]);
    LOOM_WCHECK(err < 1e-5, "(" + param.name + where + ": rel. error " + std::to_string(err) + ")");
    ++checked;
  }
  LOOM_WCHECK(checked > 0);
}

}  // namespace loom::test
