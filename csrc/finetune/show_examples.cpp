#include "finetune/show_examples.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "finetune/lora_run.h"
#include "finetune/sft_rows.h"

namespace loom::finetune {

void show_examples(const config::Recipe& recipe, int64_t n, std::ostream& out) {
  const FinetuneRunPlan plan = plan_finetune_run(recipe);
  const SftDataset& train = *plan.train;
  for (int64_t i = 0; i < std::min(n, plan.train_samples()); ++i) {
    std::vector<int64_t> ids;
    if (plan.packing) ids = plan.packing->packs[static_cast<size_t>(i)];
    else ids = {i};
    std::vector<const SftExample*> row;
    nlohmann::json sources = nlohmann::json::array(), texts = nlohmann::json::array();
    for (const int64_t e : ids) {
      row.push_back(&train[e]);
      sources.push_back(train.source(e));
      texts.push_back(plan.tokenizer->decode(std::vector<int32_t>(train[e].tokens.begin(), train[e].tokens.end())));
    }
    const SftRows rows = make_sft_rows({row}, plan.seq_length, plan.tokenizer->pad_id(),
                                       plan.recipe.model.answer_only_loss, plan.packing.has_value());
    nlohmann::json line = {{"sources", sources},      {"text", texts},
                           {"tokens", rows.tokens},   {"labels", rows.labels},
                           {"loss_mask", rows.loss_mask}, {"position_ids", rows.position_ids}};
    if (plan.packing) line["segment_ids"] = rows.segment_ids;
    out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  out.flush();
}

}  // namespace loom::finetune
