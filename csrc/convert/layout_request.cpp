#include "convert/layout_request.h"

#include <fmt/format.h>

#include "config/derived.h"
#include "convert/convert_error.h"

namespace loom::convert {

Layout resolve_layout(const LayoutRequest& r, const Layout& source) {
  auto size = [](const std::optional<int>& given, int fallback, const char* flag) {
    if (!given) return fallback;
    if (*given < 1) throw ConvertInputError(fmt::format("{}: expected an integer >= 1, found {}", flag, *given));
    return *given;
  };
  Layout out;
  out.t = size(r.tensor_parallel, source.t, "--tensor-parallel");
  out.p = size(r.pipeline_parallel, source.p, "--pipeline-parallel");
  out.v = size(r.virtual_pipeline, source.v, "--virtual-pipeline");
  out.d = size(r.data_parallel, source.d, "--data-parallel");
  out.distributed_optimizer = r.distributed_optimizer.value_or(source.distributed_optimizer);
  return out;
}

Layout recipe_layout(const config::Recipe& recipe) {
  Layout l;
  l.t = static_cast<int>(recipe.model.tensor_model_parallel_size);
  l.p = static_cast<int>(recipe.model.pipeline_model_parallel_size);
  l.v = static_cast<int>(config::virtual_pipeline_size(recipe));
  l.d = static_cast<int>(config::data_parallel_size(recipe));
  l.distributed_optimizer = config::uses_distributed_optimizer(recipe);
  return l;
}

std::vector<std::string> layout_overrides(const Layout& l, const config::Recipe& base, const std::string& run_dir) {
  std::vector<std::string> o = {
      "trainer.num_nodes=1",
      fmt::format("trainer.devices={}", l.t * l.p * l.d),
      fmt::format("model.tensor_model_parallel_size={}", l.t),
      fmt::format("model.pipeline_model_parallel_size={}", l.p),
      l.v > 1 ? fmt::format("model.virtual_pipeline_model_parallel_size={}", l.v)
              : std::string("model.virtual_pipeline_model_parallel_size=null"),
      "exp_manager.explicit_log_dir=" + run_dir,
  };
  if (l.t == 1) o.push_back("model.sequence_parallel=false");
  if (l.distributed_optimizer) {
    o.push_back("model.optim.name=distributed_fused_adam");
    o.push_back("model.use_distributed_optimizer=true");
  } else if (config::uses_distributed_optimizer(base)) {
    o.push_back("model.optim.name=adamw");
    o.push_back("model.use_distributed_optimizer=false");
  }
  return o;
}

}  // namespace loom::convert
