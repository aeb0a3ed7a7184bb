#include "planner/hardware.h"

#include "planner/text_io.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace loom::planner {
namespace detail {
extern const char* const kBuiltinGpuTableJson;
}

namespace {
using nlohmann::json;

double number_field(const json& obj, const char* field, const std::string& where) {
  auto it = obj.find(field);
  if (it == obj.end())
    throw std::invalid_argument(fmt::format("{}: missing field '{}'", where, field));
  if (!it->is_number())
    throw std::invalid_argument(
        fmt::format("{}: field '{}' must be a number, found {}", where, field, it->dump()));
  double v = it->get<double>();
  if (!(v > 0))
    throw std::invalid_argument(fmt::format("{}: field '{}' must be > 0, found {}", where, field, v));
  return v;
}

Efficiency parse_efficiency(const json& obj, const std::string& where) {
  if (!obj.is_object())
    throw std::invalid_argument(fmt::format("{}: efficiency must be an object", where));
  Efficiency e;
  struct F { const char* name; double* dst; };
  F fields[] = {{"gemm_max_fraction", &e.gemm_max_fraction},
                {"gemm_half_dim", &e.gemm_half_dim},
                {"memory_fraction", &e.memory_fraction},
                {"intra_node_comm_fraction", &e.intra_node_comm_fraction},
                {"inter_node_comm_fraction", &e.inter_node_comm_fraction},
                {"collective_latency_us", &e.collective_latency_us},
                {"kernel_launch_us", &e.kernel_launch_us},
                {"comm_overlap_fraction", &e.comm_overlap_fraction},
                {"fused_attention_fwd_fraction", &e.fused_attention_fwd_fraction},
                {"fused_attention_bwd_fraction", &e.fused_attention_bwd_fraction}};
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool known = false;
    for (auto& f : fields) {
      if (it.key() != f.name) continue;
      known = true;
      if (!it->is_number() || it->get<double>() < 0)
        throw std::invalid_argument(fmt::format("{}: efficiency.{} must be a number >= 0, found {}",
                                                where, f.name, it->dump()));
      *f.dst = it->get<double>();
    }
    if (!known && it.key().rfind('_', 0) != 0)
      throw std::invalid_argument(fmt::format("{}: unknown efficiency field '{}'", where, it.key()));
  }
  if (e.gemm_max_fraction > 1 || e.memory_fraction > 1 || e.intra_node_comm_fraction > 1 ||
      e.inter_node_comm_fraction > 1 || e.comm_overlap_fraction > 1 || e.fused_attention_fwd_fraction > 1 ||
      e.fused_attention_bwd_fraction > 1)
    throw std::invalid_argument(fmt::format("{}: efficiency fractions must be <= 1", where));
  return e;
}

GpuSpec parse_gpu(const json& obj, const json& named_eff, const std::string& where) {
  if (!obj.is_object()) throw std::invalid_argument(fmt::format("{}: a GPU must be an object", where));
  GpuSpec g;
  auto name = obj.find("name");
  if (name == obj.end() || !name->is_string() || name->get<std::string>().empty())
    throw std::invalid_argument(fmt::format("{}: missing string field 'name'", where));
  g.name = name->get<std::string>();
  const std::string w = fmt::format("{} (GPU '{}')", where, g.name);
  g.peak_tflops = number_field(obj, "peak_tflops", w);
  g.memory_gib = number_field(obj, "memory_gib", w);
  g.memory_bandwidth_gbs = number_field(obj, "memory_bandwidth_gbs", w);
  g.intra_node_gbs = number_field(obj, "intra_node_gbs", w);
  g.inter_node_gbs = number_field(obj, "inter_node_gbs", w);
  if (obj.contains("gpus_per_node")) g.gpus_per_node = int(number_field(obj, "gpus_per_node", w));
  if (auto e = obj.find("efficiency"); e != obj.end()) {
    if (e->is_string()) {
      const auto key = e->get<std::string>();
      if (!named_eff.is_object() || !named_eff.contains(key))
        throw std::invalid_argument(
            fmt::format("{}: efficiency '{}' is not defined in the table's 'efficiency' object", w, key));
      g.efficiency = parse_efficiency(named_eff.at(key), w + " efficiency '" + key + "'");
    } else {
      g.efficiency = parse_efficiency(*e, w);
    }
  }
  return g;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

std::vector<GpuSpec> parse_gpu_table(const std::string& json_text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw std::invalid_argument(fmt::format("{}: invalid JSON: {}", source, e.what()));
  }
  std::vector<GpuSpec> out;
  const json named = doc.is_object() && doc.contains("efficiency") && doc["efficiency"].is_object()
                         ? doc["efficiency"] : json::object();
  if (doc.is_object() && doc.contains("gpus")) {
    if (!doc["gpus"].is_array())
      throw std::invalid_argument(fmt::format("{}: 'gpus' must be an array", source));
    for (size_t i = 0; i < doc["gpus"].size(); ++i)
      out.push_back(parse_gpu(doc["gpus"][i], named, fmt::format("{}: gpus[{}]", source, i)));
  } else if (doc.is_object() && doc.contains("name")) {
    out.push_back(parse_gpu(doc, named, source));
  } else {
    throw std::invalid_argument(
        fmt::format("{}: expected an object with a 'gpus' array or a single GPU object", source));
  }
  return out;
}

const std::vector<GpuSpec>& builtin_gpus() {
  static const std::vector<GpuSpec> table =
      parse_gpu_table(detail::kBuiltinGpuTableJson, "built-in csrc/planner/data/gpus.json");
  return table;
}

GpuSpec find_gpu(const std::string& name, const std::vector<GpuSpec>& extra) {
  for (const auto* list : {&extra, &builtin_gpus()})
    for (const auto& g : *list)
      if (lower(g.name) == lower(name)) return g;
  std::string known;
  for (const auto* list : {&extra, &builtin_gpus()})
    for (const auto& g : *list) known += (known.empty() ? "" : ", ") + g.name;
  throw std::invalid_argument(
      fmt::format("--gpu: unknown GPU '{}'; known: {} (add one with --gpu-table FILE)", name, known));
}

std::optional<double> peak_tflops_for_device(const std::string& device_name) {
  const std::string device = lower(device_name);
  for (const auto& g : builtin_gpus()) {
    // "A100-80GB" -> "a100": the family the device's name carries ("NVIDIA A100-SXM4-80GB").
    const std::string family = lower(g.name.substr(0, g.name.find('-')));
    if (device.find(family) != std::string::npos) return g.peak_tflops;
  }
  return std::nullopt;
}

std::vector<GpuSpec> load_gpu_table_file(const std::string& path) {
  return parse_gpu_table(read_file(path), path);
}

GpuSpec fit_gemm_curve(GpuSpec gpu, const std::vector<GemmSample>& samples, double element_bytes) {
  if (samples.size() < 2)
    throw std::invalid_argument("measured profile: 'gemm' needs at least 2 samples to fit the curve");
  // The time model charges a GEMM's result write at the memory-bound bandwidth on top of the
  // shape curve (time_model.h): take it out of each measurement, so that the fitted curve is the
  // compute part only (at most 90% of a measurement is taken as the write).
  std::vector<double> compute_tflops;
  for (const auto& s : samples) {
    const double seconds = 2 * s.m * s.n * s.k / (s.tflops * 1e12);
    const double write = element_bytes * s.m * s.n / (gpu.memory_bandwidth_gbs * 1e9 * gpu.efficiency.memory_fraction);
    compute_tflops.push_back(2 * s.m * s.n * s.k / std::max(seconds - write, 0.1 * seconds) / 1e12);
  }
  // For a trial half-dimension x0 the best log-space scale is closed-form; scan x0 on a
  // fine logarithmic grid (1..4096) and keep the minimum squared error.
  double best_err = INFINITY, best_x0 = 0, best_frac = 0;
  for (double lx = 0; lx <= std::log(4096.0) + 1e-9; lx += 0.01) {
    const double x0 = std::exp(lx);
    double sum = 0;
    std::vector<double> r;
    for (size_t i = 0; i < samples.size(); ++i) {
      const auto& s = samples[i];
      const double shape = (s.m / (s.m + x0)) * (s.n / (s.n + x0)) * (s.k / (s.k + x0));
      r.push_back(std::log(compute_tflops[i] / (gpu.peak_tflops * shape)));
      sum += r.back();
    }
    const double log_frac = sum / r.size();
    double err = 0;
    for (double v : r) err += (v - log_frac) * (v - log_frac);
    if (err < best_err) { best_err = err; best_x0 = x0; best_frac = std::exp(log_frac); }
  }
  gpu.efficiency.gemm_half_dim = best_x0;
  gpu.efficiency.gemm_max_fraction = std::min(1.0, best_frac);
  return gpu;
}

GpuSpec apply_measured_profile(GpuSpec gpu, const std::string& json_text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw std::invalid_argument(fmt::format("{}: invalid JSON: {}", source, e.what()));
  }
  if (!doc.is_object()) throw std::invalid_argument(fmt::format("{}: expected a JSON object", source));
  if (doc.contains("device")) gpu = parse_gpu(doc["device"], json::object(), source + ": device");
  for (const char* key : {"collective_latency_us", "kernel_launch_us"}) {
    if (!doc.contains(key)) continue;
    if (!doc[key].is_number() || doc[key].get<double>() < 0)
      throw std::invalid_argument(fmt::format("{}: '{}' must be a number >= 0, found {}", source, key, doc[key].dump()));
    (std::string(key) == "kernel_launch_us" ? gpu.efficiency.kernel_launch_us
                                            : gpu.efficiency.collective_latency_us) = doc[key].get<double>();
  }
  if (doc.contains("memory_bandwidth_gbs"))
    gpu.efficiency.memory_fraction =
        std::min(1.0, number_field(doc, "memory_bandwidth_gbs", source) / gpu.memory_bandwidth_gbs);
  if (doc.contains("gemm")) {
    std::vector<GemmSample> samples;
    const auto& arr = doc["gemm"];
    if (!arr.is_array()) throw std::invalid_argument(fmt::format("{}: 'gemm' must be an array", source));
    for (size_t i = 0; i < arr.size(); ++i) {
      const std::string w = fmt::format("{}: gemm[{}]", source, i);
      samples.push_back({number_field(arr[i], "m", w), number_field(arr[i], "n", w),
                         number_field(arr[i], "k", w), number_field(arr[i], "tflops", w)});
    }
    // The samples' element type (measured.dtype of `loom plan calibrate`; bf16 when not said).
    const bool fp32 = doc.contains("measured") && doc["measured"].is_object() &&
                      doc["measured"].value("dtype", std::string()) == "fp32";
    gpu = fit_gemm_curve(gpu, samples, fp32 ? 4.0 : 2.0);
  }
  if (doc.contains("fused_attention")) {
    const auto& arr = doc["fused_attention"];
    if (!arr.is_array() || arr.empty())
      throw std::invalid_argument(fmt::format("{}: 'fused_attention' must be a non-empty array", source));
    double fwd = 0, bwd = 0;
    for (size_t i = 0; i < arr.size(); ++i) {
      const std::string w = fmt::format("{}: fused_attention[{}]", source, i);
      const double seq = number_field(arr[i], "seq", w);
      const double fill = seq / (seq + gpu.efficiency.gemm_half_dim);
      fwd += number_field(arr[i], "fwd_tflops", w) / (gpu.peak_tflops * fill);
      bwd += number_field(arr[i], "bwd_tflops", w) / (gpu.peak_tflops * fill);
    }
    gpu.efficiency.fused_attention_fwd_fraction = std::min(1.0, fwd / arr.size());
    gpu.efficiency.fused_attention_bwd_fraction = std::min(1.0, bwd / arr.size());
  }
  if (doc.contains("allreduce_busbw_gbs")) {
    const auto& bw = doc["allreduce_busbw_gbs"];
    const std::string w = source + ": allreduce_busbw_gbs";
    if (bw.contains("intra_node"))
      gpu.efficiency.intra_node_comm_fraction =
          std::min(1.0, number_field(bw, "intra_node", w) / gpu.intra_node_gbs);
    if (bw.contains("inter_node"))
      gpu.efficiency.inter_node_comm_fraction =
          std::min(1.0, number_field(bw, "inter_node", w) / gpu.inter_node_gbs);
  }
  return gpu;
}

}  // namespace loom::planner
