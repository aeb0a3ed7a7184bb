// The parts of prompt learning (docs/design/ptuning.md): the encoders against independent
// reference computations (a hand-written bidirectional LSTM, the MLP chain, tpmlp at t = 2
// against t = 1), initialisation as a pure function of (seed, task), prompt tuning's text
// initialisation, the splice of a multi-task batch, the exact-match rule against a brute-force
// greedy argmax (ties, padding columns, t = 2), and the safetensors tables.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "data/gpt2_tokenizer.h"
#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "launch/file_util.h"
#include "ptune/answer_metrics.h"
#include "ptune/prompt_encoder.h"
#include "ptune/prompt_model.h"
#include "ptune/prompt_tables.h"
#include "tensor_io/safetensors_file.h"

using namespace loom;
using namespace loom::ptune;
using namespace loom::tensor_io;
namespace fs = std::filesystem;

namespace {

PromptEncoderOptions encoder_options(config::PromptEncoderType type, int64_t n = 5, int64_t h = 8) {
  PromptEncoderOptions o;
  o.task = "t";
  o.tokens = n;
  o.hidden = h;
  o.p_tuning.encoder_type = type;
  o.p_tuning.encoder_hidden = 6;
  return o;
}

at::Tensor param(const PromptEncoder& e, const std::string& name) {
  for (const auto& p : e.parameters())
    if (p.name == name) return p.tensor.detach();
  FAIL("no parameter " << name);
  return {};
}

// One direction of a single-layer LSTM, PyTorch's gate order (input, forget, cell, output).
at::Tensor lstm_direction(const at::Tensor& x, const at::Tensor& w_ih, const at::Tensor& w_hh, const at::Tensor& b_ih,
                          const at::Tensor& b_hh, bool reverse) {
  const int64_t n = x.size(0), H = w_hh.size(1);
  at::Tensor h = at::zeros({H}), c = at::zeros({H});
  std::vector<at::Tensor> out(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = reverse ? n - 1 - k : k;
    const at::Tensor g = at::mv(w_ih, x[i]) + b_ih + at::mv(w_hh, h) + b_hh;
    const auto gates = g.chunk(4);
    c = at::sigmoid(gates[1]) * c + at::sigmoid(gates[0]) * at::tanh(gates[2]);
    h = at::sigmoid(gates[3]) * at::tanh(c);
    out[static_cast<size_t>(i)] = h;
  }
  return at::stack(out);
}

std::string temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("loom_ptune_" + name + "_" + std::to_string(::getpid()));
  loom::launch::remove_tree(d.string());
  fs::create_directories(d);
  return d.string();
}

// Greedy next token with the sampler's rule: the lowest id among equal maxima.
int64_t greedy(const at::Tensor& row) {
  const auto acc = row.accessor<float, 1>();
  int64_t best = 0;
  for (int64_t i = 1; i < row.size(0); ++i)
    if (acc[i] > acc[best]) best = i;
  return best;
}

}  // namespace

TEST_CASE("the lstm encoder is a bidirectional LSTM then Linear(2H, 2H), ReLU, Linear(2H, h)", "[ptune]") {
  PromptEncoder e(encoder_options(config::PromptEncoderType::kLstm), runtime::Communicator::solo());
  at::NoGradGuard g;
  const at::Tensor x = param(e, "prompt.t.input");
  auto p = [&](const std::string& n) { return param(e, "prompt.t." + n); };
  const at::Tensor fwd = lstm_direction(x, p("lstm.0.forward.w_ih"), p("lstm.0.forward.w_hh"), p("lstm.0.forward.b_ih"),
                                        p("lstm.0.forward.b_hh"), false);
  // Layer 2 of num_layers = 2 takes both directions of layer 1.
  const at::Tensor rev = lstm_direction(x, p("lstm.0.reverse.w_ih"), p("lstm.0.reverse.w_hh"), p("lstm.0.reverse.b_ih"),
                                        p("lstm.0.reverse.b_hh"), true);
  const at::Tensor l1 = at::cat({fwd, rev}, 1);
  const at::Tensor l2 = at::cat({lstm_direction(l1, p("lstm.1.forward.w_ih"), p("lstm.1.forward.w_hh"),
                                                p("lstm.1.forward.b_ih"), p("lstm.1.forward.b_hh"), false),
                                 lstm_direction(l1, p("lstm.1.reverse.w_ih"), p("lstm.1.reverse.w_hh"),
                                                p("lstm.1.reverse.b_ih"), p("lstm.1.reverse.b_hh"), true)},
                                1);
  const at::Tensor head = at::linear(at::relu(at::linear(l2, p("head.0.weight"), p("head.0.bias"))), p("head.1.weight"),
                                     p("head.1.bias"));
  const at::Tensor got = e.forward(false, 0);
  REQUIRE(got.sizes() == at::IntArrayRef({5, 8}));
  CHECK(at::allclose(got, head, 1e-5, 1e-6));
}

TEST_CASE("the mlp encoder chains num_layers linears with ReLU between them", "[ptune]") {
  auto o = encoder_options(config::PromptEncoderType::kMlp);
  o.p_tuning.num_layers = 3;
  PromptEncoder e(o, runtime::Communicator::solo());
  at::NoGradGuard g;
  auto p = [&](const std::string& n) { return param(e, "prompt.t." + n); };
  at::Tensor x = p("input");
  CHECK(p("mlp.0.weight").sizes() == at::IntArrayRef({6, 8}));
  CHECK(p("mlp.1.weight").sizes() == at::IntArrayRef({6, 6}));
  CHECK(p("mlp.2.weight").sizes() == at::IntArrayRef({8, 6}));
  x = at::relu(at::linear(x, p("mlp.0.weight"), p("mlp.0.bias")));
  x = at::relu(at::linear(x, p("mlp.1.weight"), p("mlp.1.bias")));
  x = at::linear(x, p("mlp.2.weight"), p("mlp.2.bias"));
  CHECK(at::allclose(e.forward(false, 0), x, 1e-6, 1e-6));
  CHECK(e.num_parameters() == 5 * 8 + (6 * 8 + 6) + (6 * 6 + 6) + (8 * 6 + 8));

  o.p_tuning.num_layers = 1;
  CHECK_THROWS_WITH(PromptEncoder(o, runtime::Communicator::solo()), Catch::Contains("model.p_tuning.num_layers"));
}

TEST_CASE("encoder dropout drops elements of the input table, keyed by step, only in training", "[ptune]") {
  auto o = encoder_options(config::PromptEncoderType::kMlp);
  o.p_tuning.dropout = 0.5;
  PromptEncoder e(o, runtime::Communicator::solo());
  at::NoGradGuard g;
  const at::Tensor eval = e.forward(false, 3);
  CHECK(at::equal(eval, e.forward(false, 4)));
  const at::Tensor a = e.forward(true, 3), b = e.forward(true, 3), c = e.forward(true, 4);
  CHECK(at::equal(a, b));
  CHECK_FALSE(at::equal(a, c));
  CHECK_FALSE(at::allclose(a, eval));
}

TEST_CASE("initial values are a function of (seed, task), the same for every layout", "[ptune]") {
  for (auto type : {config::PromptEncoderType::kEmbedding, config::PromptEncoderType::kMlp,
                    config::PromptEncoderType::kLstm, config::PromptEncoderType::kTpMlp}) {
    auto o = encoder_options(type);
    const at::Tensor first = PromptEncoder(o, runtime::Communicator::solo()).forward(false, 0);
    CHECK(at::equal(first, PromptEncoder(o, runtime::Communicator::solo()).forward(false, 0)));
    o.task = "other";
    CHECK_FALSE(at::equal(first, PromptEncoder(o, runtime::Communicator::solo()).forward(false, 0)));
    o.task = "t";
    o.seed = 7;
    CHECK_FALSE(at::equal(first, PromptEncoder(o, runtime::Communicator::solo()).forward(false, 0)));
  }
  // The embedding table is xavier-normal: std sqrt(2 / (n + h)).
  const at::Tensor big = PromptEncoder(encoder_options(config::PromptEncoderType::kEmbedding, 200, 300),
                                       runtime::Communicator::solo())
                             .forward(false, 0);
  CHECK(big.std().item<double>() == Approx(std::sqrt(2.0 / 500)).epsilon(0.02));
}

TEST_CASE("prompt tuning trains a table, text initialisation tiles or cuts the text's embeddings", "[ptune]") {
  data::Gpt2Tokenizer tok(std::string(LOOM_SOURCE_DIR) + "/data/gpt2-vocab.json",
                          std::string(LOOM_SOURCE_DIR) + "/data/gpt2-merges.txt");
  const at::Tensor emb = at::arange(50304 * 2, at::kFloat).view({50304, 2});
  const auto ids = tok.encode(" hello world");  // two tokens
  REQUIRE(ids.size() == 2);
  const at::Tensor t5 = text_initial_table(" hello world", 5, emb, tok);
  for (int64_t i = 0; i < 5; ++i) CHECK(at::equal(t5[i], emb[ids[i % 2]]));
  const at::Tensor t1 = text_initial_table(" hello world", 1, emb, tok);
  CHECK(at::equal(t1[0], emb[ids[0]]));
  CHECK_THROWS_WITH(text_initial_table("", 3, emb, tok), Catch::Contains("new_prompt_init_text"));

  auto o = encoder_options(config::PromptEncoderType::kMlp, 5, 2);
  o.style = config::VirtualPromptStyle::kPromptTuning;
  o.initial_table = t5;
  PromptEncoder e(o, runtime::Communicator::solo());
  REQUIRE(e.parameters().size() == 1);  // the table only, whatever encoder_type says
  CHECK(e.parameters()[0].name == "prompt.t.table");
  CHECK(at::equal(e.forward(true, 1), t5));
  o.initial_table = at::zeros({4, 2});
  CHECK_THROWS_WITH(PromptEncoder(o, runtime::Communicator::solo()), Catch::Contains("[5, 2]"));
}

TEST_CASE("the splice of a two-task batch: positions in row order, each row its task's vectors", "[ptune]") {
  config::Recipe r;
  r.kind = config::RecipeKind::kPromptLearning;
  r.model.hidden_size = 4;
  r.model.prompt.virtual_prompt_style = config::VirtualPromptStyle::kPTuning;
  r.model.prompt.p_tuning.encoder_type = config::PromptEncoderType::kEmbedding;
  std::vector<prompt_data::ParsedTemplate> templates(2);
  templates[0].spec.taskname = "a";
  templates[0].spec.total_virtual_tokens = 2;
  templates[1].spec.taskname = "b";
  templates[1].spec.total_virtual_tokens = 3;
  r.model.prompt.new_tasks = {"a", "b"};
  data::Gpt2Tokenizer tok(std::string(LOOM_SOURCE_DIR) + "/data/gpt2-vocab.json",
                          std::string(LOOM_SOURCE_DIR) + "/data/gpt2-merges.txt");
  PromptModel model(r, templates, at::Tensor(), tok, nullptr, runtime::Communicator::solo(), at::kCPU);
  CHECK(model.num_parameters() == 2 * 4 + 3 * 4);

  prompt_data::PromptBatch b;
  b.batch = 3;
  b.seq_length = 6;
  b.task = {1, 0, 1};
  b.virtual_mask = {1, 1, 1, 0, 0, 0,   // task b: 3 virtual tokens at 0..2
                    0, 1, 0, 1, 0, 0,   // task a: split 1 + 1
                    0, 0, 0, 1, 1, 1};  // task b at 3..5
  const auto tables = model.tables();
  REQUIRE(tables.size() == 2);
  const at::Tensor ta = tables[0].vectors, tb = tables[1].vectors;
  auto s = model.splice(b, 0, 3, false, 0);
  REQUIRE(s.active());
  CHECK(at::equal(s.seq_index, at::tensor(std::vector<int64_t>{0, 1, 2, 1, 3, 3, 4, 5})));
  CHECK(at::equal(s.batch_index, at::tensor(std::vector<int64_t>{0, 0, 0, 1, 1, 2, 2, 2})));
  CHECK(at::equal(s.vectors.detach(), at::cat({tb, ta, tb})));
  CHECK(s.vectors.requires_grad());
  // A micro-batch of the last row only: batch rows count from 0 in it.
  auto last = model.splice(b, 2, 1, false, 0);
  CHECK(at::equal(last.batch_index, at::zeros({3}, at::kLong)));
  CHECK(at::equal(last.seq_index, at::tensor(std::vector<int64_t>{3, 4, 5})));
  b.virtual_mask[5] = 1;  // a fourth virtual position for task b's row
  CHECK_THROWS_WITH(model.splice(b, 0, 1, false, 0), Catch::Contains("4 virtual positions"));
}

TEST_CASE("exact match: every answer position's greedy argmax (lowest id among ties) is the label", "[ptune]") {
  const int64_t s = 4, b = 3, V = 10, padded = 12;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  at::Tensor logits = at::randn({s, b, padded}, gen);
  logits.narrow(-1, V, padded - V).fill_(100.0);  // padding columns never count
  at::Tensor labels = at::zeros({b, s}, at::kLong);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t j = 0; j < s; ++j) labels[r][j] = greedy(logits[j][r].narrow(0, 0, V).contiguous());
  at::Tensor answer = at::zeros({b, s});
  answer[0].narrow(0, 2, 2).fill_(1);  // row 0: answer at 2..3, all right
  answer[1].narrow(0, 1, 3).fill_(1);  // row 1: wrong at 2
  labels[1][2] = (labels[1][2].item<int64_t>() + 1) % V;
  // row 2: a tie between the label and a lower id at position 3 (greedy takes the lower one)
  answer[2][3] = 1;
  const int64_t gold = labels[2][3].item<int64_t>();
  const int64_t other = gold == 0 ? 1 : 0;
  logits[3][2][std::max(gold, other)] = logits[3][2][std::min(gold, other)].item<float>();
  labels[2][3] = std::max(gold, other);
  const at::Tensor mask = at::ones({b, s});
  const at::Tensor totals = answer_totals(logits, labels, mask, answer, runtime::Communicator::solo(), V);
  CHECK(totals[2].item<double>() == 1.0);  // row 0 only
  CHECK(totals[3].item<double>() == 3.0);
  // The loss part is the masked cross entropy over the real vocabulary.
  const at::Tensor ce =
      at::cross_entropy_loss(logits.narrow(-1, 0, V).reshape({-1, V}), labels.t().reshape({-1}), {}, at::Reduction::Sum);
  CHECK(totals[0].item<double>() == Approx(ce.item<double>()).epsilon(1e-5));
  CHECK(totals[1].item<double>() == double(b * s));
  // With the tie broken toward the label, row 2 is right.
  labels[2][3] = std::min(gold, other);
  CHECK(answer_totals(logits, labels, mask, answer, runtime::Communicator::solo(), V)[2].item<double>() == 2.0);
}

LOOM_WORKER("answer_totals_t2") {
  auto groups = loom::test::worker_groups(2);
  const auto tp = groups->tensor_ptr();
  const int64_t s = 5, b = 4, V = 13, padded = 16;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  // Few distinct values, so that maxima tie across the two shards.
  at::Tensor logits = at::randint(0, 3, {s, b, padded}, gen).to(at::kFloat);
  at::Tensor labels = at::randint(0, V, {b, s}, gen);
  at::Tensor answer = (at::randint(0, 2, {b, s}, gen)).to(at::kFloat);
  const at::Tensor mask = at::ones({b, s});
  const at::Tensor whole = answer_totals(logits, labels, mask, answer, runtime::Communicator::solo(), V);
  const at::Tensor local = logits.narrow(-1, tp->rank() * (padded / 2), padded / 2).contiguous();
  const at::Tensor split = answer_totals(local, labels, mask, answer, tp, V);
  LOOM_WCHECK(split[2].item<double>() == whole[2].item<double>(), "exact-match counts differ");
  LOOM_WCHECK(split[3].item<double>() == whole[3].item<double>());
  LOOM_WCHECK(std::abs(split[0].item<double>() - whole[0].item<double>()) < 1e-4);
  groups->shutdown();
}

TEST_CASE("exact match on two vocabulary shards equals one shard", "[ptune][multiprocess]") {
  auto r = loom::test::run_ranks("answer_totals_t2", 2, {}, 120.0);
  INFO(r.summary());
  CHECK(r.exit_code() == 0);
}

LOOM_WORKER("tpmlp_t2") {
  auto groups = loom::test::worker_groups(2);
  auto o = encoder_options(config::PromptEncoderType::kTpMlp);
  PromptEncoder split(o, groups->tensor_ptr());
  PromptEncoder whole(o, runtime::Communicator::solo());
  const at::Tensor a = split.forward(false, 0), b = whole.forward(false, 0);
  LOOM_WCHECK(at::allclose(a, b, 1e-5, 1e-6), "tpmlp at t=2 differs from t=1");
  LOOM_WCHECK(split.num_parameters() == whole.num_parameters());
  // Gradients: the column-parallel shard's gradient is the matching slice of t=1's.
  a.sum().backward();
  b.sum().backward();
  const auto ps = split.parameters(), pw = whole.parameters();
  for (size_t i = 0; i < ps.size(); ++i) {
    at::Tensor expect = pw[i].tensor.grad();
    if (ps[i].tensor_parallel())
      expect = expect.chunk(2, ps[i].partition_dim)[groups->tensor_ptr()->rank()];
    LOOM_WCHECK(at::allclose(ps[i].tensor.grad(), expect, 1e-5, 1e-6), "gradient of " + ps[i].name);
  }
  groups->shutdown();
}

TEST_CASE("the tpmlp encoder split over two tensor ranks equals one rank, gradients too", "[ptune][multiprocess]") {
  auto r = loom::test::run_ranks("tpmlp_t2", 2, {}, 120.0);
  INFO(r.summary());
  CHECK(r.exit_code() == 0);
  auto o = encoder_options(config::PromptEncoderType::kTpMlp);
  o.p_tuning.encoder_hidden = 5;
  auto groups_free = runtime::Communicator::solo();
  CHECK_NOTHROW(PromptEncoder(o, groups_free));  // 5 % 1 == 0
}

TEST_CASE("safetensors: a round trip, and malformed files named with what is wrong", "[ptune]") {
  const std::string dir = temp_dir("st");
  const std::string path = dir + "/x.safetensors";
  SafetensorsContent c;
  c.tensors["b"] = at::arange(6, at::kFloat).view({2, 3});
  c.tensors["a"] = at::ones({1}, at::kFloat);
  c.metadata["task"] = "t";
  write_safetensors(path, c);
  const auto back = read_safetensors(path);
  CHECK(at::equal(back.tensors.at("b"), c.tensors["b"]));
  CHECK(at::equal(back.tensors.at("a"), c.tensors["a"]));
  CHECK(back.metadata.at("task") == "t");
  {
    std::ifstream f(path, std::ios::binary);
    unsigned char n[8];
    f.read(reinterpret_cast<char*>(n), 8);
    CHECK(n[0] % 8 == 0);  // the header is padded to a multiple of 8 bytes
  }

  auto write_bytes = [&](const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  };
  write_bytes("abc");
  CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("shorter than the 8-byte header length"));
  write_bytes(std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8));
  CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("beyond the file"));
  const std::string h = R"({"t":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})";
  std::string len(8, '\0');
  len[0] = static_cast<char>(h.size());
  write_bytes(len + h + "x");
  CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("has dtype \"F8_E4M3\", expected F64, F32"));
  const std::string h2 = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  len[0] = static_cast<char>(h2.size());
  write_bytes(len + h2 + "xxxx");
  CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("data_offsets [0, 8]"));
  CHECK_THROWS_WITH(read_safetensors(dir + "/missing"), Catch::Contains("cannot open"));
  loom::launch::remove_tree(dir);
}

TEST_CASE("prompt tables: written and read back with their templates, a damaged index is named", "[ptune]") {
  const std::string run = temp_dir("tables");
  PromptTables t;
  t.style = "p-tuning";
  t.base = {{"path", "runs/base"}, {"iteration", 300}};
  t.iteration = 40;
  t.val_loss = 0.5;
  PromptTable a;
  a.spec.taskname = "mood";
  a.spec.prompt_template = "<|VIRTUAL_PROMPT_0|> {text} Mood:{label}";
  a.spec.prompt_template_fields = {"text", "label"};
  a.spec.total_virtual_tokens = 3;
  a.spec.virtual_token_splits = {3};
  a.spec.answer_field = "label";
  a.vectors = at::randn({3, 4});
  PromptTable b = a;
  b.spec.taskname = "odd name/with slash";
  b.vectors = at::randn({3, 4});
  PromptTable c = a;
  c.spec.taskname = "task_1";  // the file name the non-plain task 1 gets: no clash
  c.vectors = at::randn({3, 4});
  t.tasks = {a, b, c};
  write_prompt_tables(prompt_tables_dir(run), t);
  CHECK(fs::exists(prompt_tables_dir(run) + "/mood.safetensors"));
  CHECK(fs::exists(prompt_tables_dir(run) + "/task_1.safetensors"));
  CHECK(fs::exists(prompt_tables_dir(run) + "/task_1_2.safetensors"));
  const PromptTables back = read_prompt_tables(run);  // the run directory works too
  REQUIRE(back.tasks.size() == 3);
  CHECK(at::equal(back.find("task_1")->vectors, c.vectors));
  CHECK(back.tasks[0].spec == a.spec);
  CHECK(at::equal(back.find("odd name/with slash")->vectors, b.vectors));
  CHECK(back.base["iteration"] == 300);
  CHECK(back.find("none") == nullptr);

  // A crash while the next set is written (after its first table, or after its index) leaves
  // the folder holding the old set whole, and the next write succeeds.
  PromptTables next = t;
  for (auto& table : next.tasks) table.vectors = at::randn({3, 4});
  next.iteration = 50;
  for (int crash_after : {1, 4}) {
    int files = 0;
    struct Crash {};
    CHECK_THROWS_AS(write_prompt_tables(prompt_tables_dir(run), next,
                                        [&](const std::string&) {
                                          if (++files == crash_after) throw Crash{};
                                        }),
                    Crash);
    const PromptTables kept = read_prompt_tables(run);
    CHECK(kept.iteration == 40);
    for (size_t i = 0; i < t.tasks.size(); ++i) CHECK(at::equal(kept.tasks[i].vectors, t.tasks[i].vectors));
  }
  write_prompt_tables(prompt_tables_dir(run), next);
  const PromptTables swapped = read_prompt_tables(run);
  CHECK(swapped.iteration == 50);
  for (size_t i = 0; i < next.tasks.size(); ++i) CHECK(at::equal(swapped.tasks[i].vectors, next.tasks[i].vectors));
  CHECK_FALSE(fs::exists(prompt_tables_dir(run) + ".new"));

  std::ofstream(prompt_tables_dir(run) + "/index.json", std::ios::trunc) << "{\"tasks\": 3}";
  CHECK_THROWS_WITH(read_prompt_tables(run), Catch::Contains("index.json: malformed index"));
  CHECK_THROWS_WITH(read_prompt_tables(run + "/nothing"), Catch::Contains("no prompt tables here"));
  loom::launch::remove_tree(run);
}
