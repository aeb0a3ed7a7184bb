#include "planner/memory_breakdown.h"

#include <algorithm>
#include <cmath>

#include "planner/memory_model.h"

namespace loom::planner {
namespace {

// Megatron-Core's bucket_size default, as train/run_settings.cpp applies it: max(40M, 1M·d).
double bucket_params(const TrainingSetup& setup, int d) {
  return setup.dp_bucket_params > 0 ? setup.dp_bucket_params : std::max(40e6, 1e6 * d);
}

// What the parameters of one stage look like to the optimizer and to backward.
struct StageParams {
  double total = 0;          // stage_params
  double decay = 0;          // with weight decay (not biases or norms: model/parameter.h)
  double largest = 0;        // elements of the largest tensor
  double largest_chunk = 0;  // parameters of the chunk with the most
  double word = 0;           // the tied word-embedding shard V/t·h held here (0 on middle stages and
                             // when the output layer is untied: nothing is shared between stages)
};

StageParams params_of(const ModelShape& m, const Layout& L, int stage) {
  const double h = m.hidden_size, t = L.tp;
  const double word = double(m.padded_vocab_size(L.tp)) / t * h;
  const double positions = position_table_params(m);
  const int layers = L.stage_layers(m.num_layers, stage);
  const int per_chunk = layers / L.vp;
  const LayerParameters lp = layer_parameters(m);
  const double layer = lp.per_rank(L.tp);
  const double layer_no_decay = lp.split_biases / t + lp.replicated;  // biases and norms
  const bool first = stage == 0, last = stage == L.pp - 1;
  const double head = last ? norm_parameters(m) + output_layer_params(m, L) : 0.0;  // final norm, output layer
  StageParams out;
  out.total = stage_params(m, L, stage);
  out.word = m.share_embeddings_and_output_weights && (first || (last && L.pp > 1)) ? word : 0.0;
  out.decay = out.total - layers * layer_no_decay - (last ? norm_parameters(m) : 0.0);
  const double layer_largest = double(std::max(qkv_width(m), fc1_width(m))) * h / t;  // QKV or fc1 weight
  out.largest = std::max({layers > 0 ? layer_largest : 0.0, first ? word : 0.0, head - (last ? norm_parameters(m) : 0.0),
                          first ? positions : 0.0});
  // Chunk 0 of stage 0 holds the embeddings, the last chunk of the last stage the head.
  const double embedding = first ? word + positions : 0.0;
  const double first_chunk = per_chunk * layer + embedding + (L.vp == 1 ? head : 0.0);
  const double last_chunk = per_chunk * layer + head + (L.vp == 1 ? embedding : 0.0);
  out.largest_chunk = std::max(first_chunk, last_chunk);
  return out;
}

}  // namespace

ModelStates model_states(double params, Precision precision, bool distributed, int d) {
  ModelStates st;
  st.parameters = params * element_bytes(precision);
  st.gradients = 4 * params;
  const double shard = distributed ? double(d) : 1.0;
  // Plain fp32 updates the parameters in place; every distributed shard is its own fp32 copy.
  st.main_params = (precision == Precision::kFp32 && !distributed) ? 0.0 : 4 * params / shard;
  st.optimizer_moments = 8 * params / shard;
  return st;
}

const char* to_string(PeakMoment m) {
  switch (m) {
    case PeakMoment::kForward: return "forward";
    case PeakMoment::kBackward: return "backward";
    case PeakMoment::kOptimizer: return "optimizer";
  }
  return "?";
}

double norm_saved_bytes(const ModelShape& m, double tokens, double e) {
  const double h = m.hidden_size;
  // LayerNorm: its input and fp32 mean and rstd. RMSNorm's ATen composition (model/rms_norm.cpp):
  // its input in fp32 (the input itself for fp32 models, a copy otherwise), the fp32 rstd and the
  // normalised tensor before the weight.
  if (m.normalization == Normalization::kLayerNorm) return tokens * (h * e + 8);
  return tokens * (h * (4 + e) + 4);
}

double saved_qkv_width(const ModelShape& m, int t) {
  const int64_t a = m.num_attention_heads, g = m.query_groups();
  const double q = double(a * m.head_dim()) / t, kv = double(g * m.head_dim()) / t;
  const bool rope = m.position_embedding_type == PositionEmbedding::kRope, grouped = g < a;
  // model/attention.cpp: Q, K and V are views of the one QKV output unless RoPE rewrites Q and K,
  // grouped-query attention expands K and V to every head (copies), or the query heads of more
  // than one group on a rank are gathered into one tensor (a copy too).
  const bool query_copy = !rope && grouped && g / t > 1;
  const bool qkv_output = !grouped || (!rope && !query_copy);  // a view of it is kept
  double width = qkv_output ? double(qkv_width(m)) / t : 0.0;
  if (rope || query_copy) width += q;
  if (grouped) width += 2 * q;   // K and V expanded to a/t heads
  else if (rope) width += kv;    // rotated K
  return width;
}

double loom_layer_activation_bytes(const ModelShape& m, int b, int t, bool sp, RecomputeGranularity r, bool fused,
                                   Precision precision, bool attention_dropout) {
  const double s = m.seq_length, h = m.hidden_size, a = m.num_attention_heads;
  const double e = element_bytes(precision);
  const double sb = s * b, shard = sp ? t : 1;
  if (r == RecomputeGranularity::kFull) return sb * h / shard * e;
  const double attention_width = a * double(m.head_dim()) / t;  // the projection's input
  // The two norms and the QKV / fc1 GEMM inputs (their outputs); Q, K, V as the core keeps them,
  // the projection input; fc1's output and the GeLU output, or for SwiGLU fc1's output (gate and
  // up), silu(gate) and the product.
  const double mlp = (m.activation == Activation::kSwiglu ? 4.0 : 2.0) * double(m.ffn()) / t;
  double bytes = 2 * norm_saved_bytes(m, sb / shard, e) + 2 * sb * h / shard * e +
                 (saved_qkv_width(m, t) + attention_width + mlp) * sb * e;
  if (fused) {
    bytes += 4 * a * s * b / t + attention_width * sb * e;  // log-sum-exp, and the kernel's own output
  } else if (r != RecomputeGranularity::kSelective) {
    bytes += (attention_dropout ? 2 : 1) * a * s * s * b / t * e;  // softmax (and dropout) outputs
  }
  return bytes;
}

double rotary_table_bytes(const ModelShape& m, int b, Precision precision) {
  if (m.position_embedding_type != PositionEmbedding::kRope) return 0.0;
  return 2.0 * b * double(m.seq_length) * double(m.rotary_dim()) * element_bytes(precision);  // cos and sin
}

namespace {

/// The optimizer step's moment and the distributed optimizer's all-gathered parameters.
struct OptimizerMoment {
  PeakParts parts;
  double publish = 0;  ///< bytes of the all-gathered parameters (distributed optimizer)
};

OptimizerMoment optimizer_moment(const TrainingSetup& setup, const Layout& L, const StageParams& P, double e) {
  const int p = L.pp, d = L.dp;
  const Precision prec = setup.precision;
  // After the last backward (train/optim/optimizer.cpp: step): the gradient reduction (the
  // tied embedding's packed all-reduce between the end stages, grad_finalize.cpp; the
  // distributed optimizer's reduce-scatter shard of a bucket), the update's temporaries and the
  // distributed optimizer's parameter all-gathers, one after the other.
  OptimizerMoment o;
  PeakParts& opt = o.parts;
  const double bucket = std::min(P.total, bucket_params(setup, d));
  const bool reduce_scatter = L.distributed_optimizer && d > 1;
  // The packed all-reduce is freed before the bucket's reduce-scatter starts (grad_finalize.cpp).
  const double finalize = std::max(p > 1 ? 4 * P.word : 0.0, reduce_scatter ? 4 * bucket / d : 0.0);
  const double piece = L.distributed_optimizer ? std::min(P.largest, bucket / d) : P.largest;
  double update = 0;
  switch (setup.optimizer_update) {
    case OptimizerUpdate::kPerTensor: update = 8 * piece; break;
    case OptimizerUpdate::kForEach:
      update = 8 * std::min(P.decay, bucket) / (L.distributed_optimizer ? d : 1);
      break;
    case OptimizerUpdate::kFused: update = 0; break;
  }
  if (prec == Precision::kFp16) update = std::max(update, 2 * piece);  // the overflow check's masks
  const double publish = o.publish =
      L.distributed_optimizer ? (prec == Precision::kFp32 ? 4 * P.total : e * P.total * (1 + 1.0 / d)) : 0.0;
  if (finalize >= std::max(update, publish)) opt.communication = finalize;
  else if (update >= publish) opt.workspace = update;
  else opt.communication = publish;
  return o;
}

/// One model chunk's stored activations for one micro-batch and the backward's recompute working
/// set, under the layout's recompute setting.
struct ChunkActivations {
  double stored = 0;     ///< bytes kept from the chunk's forward until its backward
  double recompute = 0;  ///< bytes the backward re-creates at once (selective: the attention core)
};

ChunkActivations chunk_activations(const ModelShape& m, const TrainingSetup& setup, const Layout& L, int per_chunk) {
  const int t = L.tp, b = L.micro_batch;
  const bool sp = L.sequence_parallel;
  const Precision prec = setup.precision;
  const double e = element_bytes(prec);
  const double s = m.seq_length, a = m.num_attention_heads;
  // One chunk's stored activations (model/gpt_stage.cpp: run_layers).
  const auto layer = [&](RecomputeGranularity r) {
    return loom_layer_activation_bytes(m, b, t, sp, r, setup.fused_attention, prec, setup.attention_dropout);
  };
  const double full_layer = layer(RecomputeGranularity::kNone);
  ChunkActivations c;
  double& chunk = c.stored;
  double& recompute = c.recompute;
  switch (L.recompute.granularity) {
    case RecomputeGranularity::kNone: chunk = per_chunk * full_layer; break;
    case RecomputeGranularity::kSelective:
      chunk = per_chunk * layer(RecomputeGranularity::kSelective);
      // The attention core re-run in backward: scores, softmax and dropout outputs and their
      // gradient (model/attention.cpp, loom::core_attention); without attention dropout one
      // [b, a/t, s, s] tensor (measured: llama_tiny at s = 512 on the stand-in, docs/planner.md).
      recompute = per_chunk > 0 ? (setup.attention_dropout ? 2.5 : 1.0) * a * s * s * b / t * e : 0.0;
      break;
    case RecomputeGranularity::kFull: {
      const double input = layer(RecomputeGranularity::kFull);
      if (L.recompute.method != RecomputeMethod::kBlock) {
        const int k = std::max(1, std::min(int(L.recompute.num_layers.value_or(0)), per_chunk));
        chunk = std::ceil(double(per_chunk) / k) * input;
        recompute = k * full_layer;
      } else {
        const int k = std::min(std::max(0, int(L.recompute.num_layers.value_or(0))), per_chunk);
        chunk = k * input + (per_chunk - k) * full_layer;
        recompute = k > 0 ? full_layer : 0.0;
      }
      break;
    }
  }
  // RoPE's cos and sin tables, made once per chunk forward and kept by every layer's rotation.
  if (per_chunk > 0) chunk += rotary_table_bytes(m, b, prec);
  return c;
}

}  // namespace

StageBreakdown stage_breakdown(const ModelShape& m, const TrainingSetup& setup, const Layout& L, int stage) {
  StageBreakdown out;
  const int t = L.tp, p = L.pp, v = L.vp, b = L.micro_batch, d = L.dp;
  const bool first = stage == 0, last = stage == p - 1, sp = L.sequence_parallel;
  const Precision prec = setup.precision;
  const double e = element_bytes(prec);
  const double h = m.hidden_size, s = m.seq_length;
  const double vocab_shard = double(m.padded_vocab_size(t)) / t;
  const double shard = sp ? t : 1;
  const double sbh = s * b * h, sbv = s * b * vocab_shard;
  const StageParams P = params_of(m, L, stage);
  out.stage = stage;
  out.layers = L.stage_layers(m.num_layers, stage);
  const int m_micro = setup.global_batch / (d * b);
  out.in_flight = in_flight_chunks(p, v, m_micro, stage);
  out.states = model_states(P.total, prec, L.distributed_optimizer, d);
  const ChunkActivations c = chunk_activations(m, setup, L, out.layers / v);
  const double chunk = c.stored, recompute = c.recompute;
  // The head (last stage): final LayerNorm input and stats, the logits GEMM's (sharded) input,
  // and the saved fp32 softmax, for each micro-batch of the last chunk held: one, except when an
  // interleaved schedule with m = p runs every forward first.
  const int last_held = last ? (v > 1 && m_micro == p ? m_micro : 1) : 0;
  const double head = norm_saved_bytes(m, s * b / shard, e) + sbh / shard * e;
  const double softmax = 4 * sbv;
  const double held = out.in_flight * chunk + last_held * head;

  // Forward of the newest micro-batch; on the last stage its cross entropy (model/cross_entropy.cpp):
  // the logits in the model dtype, their fp32 copy (not for fp32) and the shifted logits that
  // become the saved softmax.
  PeakParts fwd;
  fwd.activations = held;
  fwd.recompute = L.recompute.granularity == RecomputeGranularity::kSelective ? recompute : 0.0;
  if (last) fwd.logits = (last_held - 1) * softmax + (e + (prec == Precision::kFp32 ? 0.0 : 4.0) + 4.0) * sbv;
  // On the last stage the cross entropy runs after the layers' attention cores have freed their
  // working sets: the forward's peak is the larger of the two, not their sum.
  if (last) fwd.recompute = std::max(0.0, fwd.recompute - fwd.logits);

  // First backward of the steady state: everything held, the backward's working set; on the
  // last stage the saved softmax becomes the logits gradient (cast to the model dtype), and the
  // logits GEMM's backward makes the output embedding's weight gradient.
  PeakParts bwd;
  bwd.activations = held;
  bwd.recompute = recompute;
  bwd.communication = (last ? 0.0 : sbh / shard * e) + (first && v == 1 ? 0.0 : sbh / shard * e);
  if (last) {
    // The cast, then the GEMM's backward beside the gradient (its weight gradient, dgrad), then
    // the weight gradient's copy in the parameter's layout (the transposed result is not kept as
    // .grad) with the gradient of the logits gone.
    // (Without SP the logits GEMM is at::linear, whose weight gradient is a transposed view;
    // under SP Loom's own linear makes it contiguous.)
    const double word = vocab_shard * h * e;
    const double cast = prec == Precision::kFp32 ? 4.0 * sbv : (4.0 + e) * sbv;
    const double gemm = (prec == Precision::kFp32 ? 4.0 : e) * sbv + word + sbh * e * (sp ? 2 : 1);
    bwd.logits = (last_held - 1) * softmax + std::max({cast, gemm, sp ? 0.0 : 2 * word + sbh * e});
  }
  // End of that backward: its chunk's activations are gone, its parameters' gradients exist in
  // the model dtype. With the embedding tied on one stage (p = 1) autograd holds the logits
  // GEMM's weight gradient until the embedding's arrives (both uses feed one AccumulateGrad)
  // and adds them: in place under SP, into a third V/t·h tensor without (a transposed view).
  PeakParts bwd_end;
  bwd_end.activations = (out.in_flight - 1) * chunk;
  if (last_held > 1) bwd_end.logits = (last_held - 1) * (head + softmax);
  bwd_end.grads = P.largest_chunk * e + (p == 1 ? (sp ? 1 : 2) * P.word * e : 0.0);
  const PeakParts& backward = bwd_end.total() > bwd.total() ? bwd_end : bwd;

  const OptimizerMoment o = optimizer_moment(setup, L, P, e);
  const PeakParts& opt = o.parts;
  const double publish = o.publish;

  out.moment = PeakMoment::kForward;
  out.at_peak = fwd;
  if (backward.total() > out.at_peak.total()) {
    out.moment = PeakMoment::kBackward;
    out.at_peak = backward;
  }
  if (opt.total() > out.at_peak.total()) {
    out.moment = PeakMoment::kOptimizer;
    out.at_peak = opt;
  }
  if (L.distributed_optimizer && setup.overlap_param_gather) out.after_step_extra = publish;
  return out;
}

std::vector<StageBreakdown> every_stage_breakdown(const ModelShape& m, const TrainingSetup& setup, const Layout& L) {
  std::vector<StageBreakdown> out;
  for (int stage = 0; stage < L.pp; ++stage) out.push_back(stage_breakdown(m, setup, L, stage));
  return out;
}

}  // namespace loom::planner
