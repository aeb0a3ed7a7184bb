#include "serve/decode_graphs.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "model/lora_serving.h"
#include "model/prompt_splice.h"
#include "runtime/run_device.h"

// The capture needs torch's CUDA headers (a CUDA build of torch); without them only the eager
// runner exists and asking for capture is refused.
#if __has_include(<ATen/cuda/CUDAGraph.h>) && __has_include(<cuda_runtime_api.h>)
#define LOOM_HAS_CUDA_GRAPHS 1
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#else
#define LOOM_HAS_CUDA_GRAPHS 0
#endif

namespace loom::serve {

DecodeGraphMode parse_decode_graph_mode(const std::string& name) {
  if (name == "auto") return DecodeGraphMode::kAuto;
  if (name == "on") return DecodeGraphMode::kOn;
  if (name == "off") return DecodeGraphMode::kOff;
  throw std::invalid_argument("--cuda-graphs: expected auto, on or off, found '" + name + "'");
}

std::vector<int64_t> decode_graph_buckets(int64_t max_batch) {
  if (max_batch < 1) throw std::invalid_argument("decode_graph_buckets: max_batch must be >= 1, found " +
                                                 std::to_string(max_batch));
  std::vector<int64_t> out;
  for (int64_t b : {1, 2, 4})
    if (b < max_batch) out.push_back(b);
  for (int64_t b = 8; b < max_batch; b += 8) out.push_back(b);
  out.push_back(max_batch);
  return out;
}

int64_t decode_graph_bucket(const std::vector<int64_t>& buckets, int64_t rows) {
  const auto it = std::lower_bound(buckets.begin(), buckets.end(), rows);
  if (rows < 1 || it == buckets.end())
    throw std::out_of_range(fmt::format("decode_graph_bucket: {} rows, expected 1 to {}", rows,
                                        buckets.empty() ? 0 : buckets.back()));
  return *it;
}

#if LOOM_HAS_CUDA_GRAPHS
struct DecodeGraphs::Graphs {
  c10::cuda::MempoolId_t pool = at::cuda::graph_pool_handle();  // shared: buckets replay one at a time
  std::map<int64_t, std::unique_ptr<at::cuda::CUDAGraph>> graph;
  std::map<int64_t, at::Tensor> output;  // each graph's logits, written by every replay
};
#else
struct DecodeGraphs::Graphs {};
#endif

DecodeGraphs::DecodeGraphs(const model::GptStage& stage, model::KvCache& cache, int64_t max_batch,
                           int64_t scratch_block, bool capture)
    : stage_(stage),
      cache_(cache),
      buckets_(decode_graph_buckets(max_batch)),
      largest_(buckets_.back()),
      scratch_block_(scratch_block),
      capture_(capture) {
  if (!stage.layout().pre_process || !stage.layout().post_process)
    throw std::invalid_argument("DecodeGraphs: the fixed-shape decode steps need the whole model on the rank "
                                "(--pipeline-parallel 1)");
  if (!cache.is_paged()) throw std::invalid_argument("DecodeGraphs: the cache is not paged");
  const int64_t context = stage.config().max_position_embeddings, block = cache.block_size();
  max_blocks_ = (context + block - 1) / block;
  const at::Device device = stage.parameters().front().tensor.device();
  if (capture) {
    if (!LOOM_HAS_CUDA_GRAPHS || !device.is_cuda())
      throw std::invalid_argument("DecodeGraphs: CUDA graphs are captured on CUDA only (this build: " +
                                  std::string(LOOM_HAS_CUDA_GRAPHS ? "CUDA torch" : "no CUDA torch") + ", device " +
                                  device.str() + ")");
    graphs_ = std::make_unique<Graphs>();
  }
  const int64_t size = (5 + max_blocks_) * largest_;
  const auto device_options = at::TensorOptions().dtype(at::kLong).device(device);
  // Pinned where there is a device: the step's one copy does not wait for it.
  const auto host_options = at::TensorOptions().dtype(at::kLong).pinned_memory(!device.is_cpu());
  host_ = at::zeros({size}, host_options);
  device_ = at::zeros({size}, device_options);
  starts_ = at::arange(largest_ + 1, device_options);
  for (int64_t b : buckets_) {
    model::KvCache::StaticIndex& index = index_[b];
    index.positions = device_.narrow(0, largest_, b).view({1, b});
    index.blocks = device_.narrow(0, 2 * largest_, b);
    index.offsets = device_.narrow(0, 3 * largest_, b);
    index.lengths = device_.narrow(0, 4 * largest_, b);
    index.tables = device_.narrow(0, 5 * largest_, b * max_blocks_).view({b, max_blocks_});
    index.starts = starts_.narrow(0, 0, b + 1);
  }
}

DecodeGraphs::~DecodeGraphs() = default;

bool DecodeGraphs::fits(int64_t row) const {
  return static_cast<int64_t>(cache_.row_blocks(row).size()) <= max_blocks_;
}

at::Tensor DecodeGraphs::forward(int64_t bucket) {
  const at::Tensor tokens = device_.narrow(0, 0, bucket).view({1, bucket});
  return stage_.forward_cached(tokens, cache_, model::PromptSplice{}, at::Tensor(), model::LoraBatch{});
}

at::Tensor DecodeGraphs::run(const std::vector<int64_t>& tokens, const std::vector<int64_t>& rows) {
  const int64_t real = static_cast<int64_t>(rows.size()), bucket = decode_graph_bucket(buckets_, real);
  if (static_cast<int64_t>(tokens.size()) != real)
    throw std::invalid_argument(fmt::format("DecodeGraphs::run: {} tokens for {} rows", tokens.size(), real));
  // The host buffer, laid out as device_: every field has room for the largest bucket.
  int64_t* h = host_.data_ptr<int64_t>();
  int64_t *token = h, *position = h + largest_, *block = h + 2 * largest_, *offset = h + 3 * largest_;
  int64_t *length = h + 4 * largest_, *table = h + 5 * largest_;
  std::fill(table, table + bucket * max_blocks_, 0);  // entries past a row's blocks are never read
  const int64_t block_size = cache_.block_size();
  for (int64_t i = 0; i < bucket; ++i) {
    if (i >= real) {  // padding: one position in the scratch block; its logits are ignored
      token[i] = 0, position[i] = 0, block[i] = scratch_block_, offset[i] = 0, length[i] = 1;
      table[i * max_blocks_] = scratch_block_;
      continue;
    }
    const std::vector<int64_t>& blocks = cache_.row_blocks(rows[static_cast<size_t>(i)]);
    const int64_t at = cache_.row_length(rows[static_cast<size_t>(i)]);
    if (static_cast<int64_t>(blocks.size()) > max_blocks_ || at >= static_cast<int64_t>(blocks.size()) * block_size)
      throw std::out_of_range(fmt::format("DecodeGraphs::run: row {} holds {} positions in {} blocks (room for {} "
                                          "blocks, and one more position needed)",
                                          rows[static_cast<size_t>(i)], at, blocks.size(), max_blocks_));
    token[i] = tokens[static_cast<size_t>(i)];
    position[i] = at;
    block[i] = blocks[static_cast<size_t>(at / block_size)];
    offset[i] = at % block_size;
    length[i] = at + 1;
    std::copy(blocks.begin(), blocks.end(), table + i * max_blocks_);
  }
  cache_.select_flat(rows, std::vector<int64_t>(static_cast<size_t>(real), 1));
  // One copy of every input (the previous step's copy is done: its tokens were read back).
  device_.copy_(host_, /*non_blocking=*/true);

  // The graph region: from here to the logits, nothing waits for the device.
  const std::optional<int64_t> waits_before = runtime::device_host_waits();
  cache_.use_static_index(&index_.at(bucket));
  at::Tensor logits;
  try {
    logits = graphs_ ? replay(bucket) : forward(bucket);
  } catch (...) {
    cache_.use_static_index(nullptr);
    throw;
  }
  cache_.use_static_index(nullptr);
  if (const auto waits_after = runtime::device_host_waits(); waits_before && waits_after)
    stats_.region_host_waits = stats_.region_host_waits.value_or(0) + *waits_after - *waits_before;

  cache_.advance(real);  // the real rows' one new position each
  ++stats_.steps;
  ++stats_.steps_by_bucket[bucket];
  stats_.padded_rows += bucket - real;
  return logits.narrow(0, 0, real);
}

at::Tensor DecodeGraphs::replay(int64_t bucket) {
#if LOOM_HAS_CUDA_GRAPHS
  Graphs& g = *graphs_;
  if (const auto it = g.output.find(bucket); it != g.output.end()) {
    g.graph.at(bucket)->replay();
    return it->second;
  }
  // First step of this bucket: a warm-up run (lazy initialisations, e.g. cuBLAS workspaces,
  // stay out of the graph) and the capture, on a side stream as CUDA requires; both write the
  // keys and values the replay then writes again, the same ones.
  const at::Device device = device_.device();
  c10::cuda::CUDAGuard device_guard(device);
  const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(device.index());
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
  at::cuda::CUDAEvent inputs_ready;
  inputs_ready.record(main);
  inputs_ready.block(side);
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  at::Tensor out;
  try {
    c10::cuda::CUDAStreamGuard on_side(side);
    forward(bucket);
    graph->capture_begin(g.pool, cudaStreamCaptureModeThreadLocal);
    out = forward(bucket);
    graph->capture_end();
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("capturing the decode step of batch bucket {} as a CUDA graph failed "
                                         "(loom serve --cuda-graphs off runs without): {}",
                                         bucket, e.what()));
  }
  at::cuda::CUDAEvent captured;
  captured.record(side);
  captured.block(main);
  graph->replay();
  ++stats_.captures;
  g.graph[bucket] = std::move(graph);
  g.output[bucket] = out;
  return out;
#else
  (void)bucket;
  throw std::logic_error("DecodeGraphs::replay: built without CUDA graphs");
#endif
}

}  // namespace loom::serve
