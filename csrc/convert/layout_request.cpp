#include "convert/layout_request.h"

#include <fmt/format.h>

#include <stdexcept>

#include "config/derived.h"
#include "convert/convert_error.h"

namespace loom::convert {

Layout resolve_layout(const LayoutRequest& r, const Layout& source) {
  auto size = [](const std::optional<int>& given, int fallback, const char* flag) {
    if (!given) return fallback;
    if (*given < 1) throw ConvertInputError(fmt::format("{}: expected an integer >= 1, found {}", flag, *given));
    return *given;
  };
  Layout out = source;
  out.tp = size(r.tensor_parallel, source.tp, "--tensor-parallel");
  out.pp = size(r.pipeline_parallel, source.pp, "--pipeline-parallel");
  out.vp = size(r.virtual_pipeline, source.vp, "--virtual-pipeline");
  out.dp = size(r.data_parallel, source.dp, "--data-parallel");
  out.distributed_optimizer = r.distributed_optimizer.value_or(source.distributed_optimizer);
  const bool same_split = out.pp == source.pp && out.vp == source.vp;
  auto stage = [&](const std::optional<std::string>& given, const std::optional<int>& kept,
                   const char* flag) -> std::optional<int> {
    if (!given) return same_split ? kept : std::nullopt;
    if (*given == "even") return std::nullopt;
    size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(*given, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != given->size() || n < 1)
      throw ConvertInputError(fmt::format("{}: expected even or an integer >= 1, found {}", flag, *given));
    return n;
  };
  out.first_stage_layers = stage(r.first_stage_layers, source.first_stage_layers, "--first-stage-layers");
  out.last_stage_layers = stage(r.last_stage_layers, source.last_stage_layers, "--last-stage-layers");
  return out;
}

std::vector<std::string> layout_overrides(const Layout& l, const config::Recipe& base, const std::string& run_dir) {
  std::vector<std::string> o = {
      "trainer.num_nodes=1",
      fmt::format("trainer.devices={}", l.tp * l.pp * l.dp),
      fmt::format("model.tensor_model_parallel_size={}", l.tp),
      fmt::format("model.pipeline_model_parallel_size={}", l.pp),
      l.vp > 1 ? fmt::format("model.virtual_pipeline_model_parallel_size={}", l.vp)
              : std::string("model.virtual_pipeline_model_parallel_size=null"),
      "exp_manager.explicit_log_dir=" + run_dir,
      "model.num_layers_in_first_pipeline_stage=" +
          (l.first_stage_layers ? std::to_string(*l.first_stage_layers) : std::string("null")),
      "model.num_layers_in_last_pipeline_stage=" +
          (l.last_stage_layers ? std::to_string(*l.last_stage_layers) : std::string("null")),
  };
  if (l.tp == 1) o.push_back("model.sequence_parallel=false");
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
