// loom_eval's rules against independent references: Python's string functions, random module
// and lm-evaluation-harness's metric functions (expected values computed with CPython 3.11
// and lm_eval 0.4.13, written here), the harness's token-request rules, and the scorer against
// log_softmax / argmax of a tiny model's full logits, batched and one at a time.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "data/gpt2_tokenizer.h"
#include "eval/eval_error.h"
#include "eval/metrics.h"
#include "eval/python_random.h"
#include "eval/scorer.h"
#include "eval/task_docs.h"
#include "eval/text_rules.h"
#include "eval/token_requests.h"
#include "generate/generate_test_util.h"

using namespace loom;
using namespace loom::eval;

namespace {

data::Gpt2Tokenizer& gpt2() {
  static data::Gpt2Tokenizer tok(std::string(LOOM_SOURCE_DIR) + "/data/gpt2-vocab.json",
                                 std::string(LOOM_SOURCE_DIR) + "/data/gpt2-merges.txt");
  return tok;
}

std::vector<int64_t> ids(const std::string& text) {
  const auto v = gpt2().encode(text);
  return {v.begin(), v.end()};
}

std::string temp_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("loom_eval_" + std::to_string(getpid()) + "_" + name);
  std::ofstream(path) << text;
  return path.string();
}

}  // namespace

TEST_CASE("Python string rules: whitespace, strip, split, word count, capitalize") {
  CHECK(std::string(rstrip(" x\xE3\x80\x80 \t")) == " x");  // U+3000 is whitespace to Python
  CHECK(std::string(strip("\xC2\xA0 ab c\n")) == "ab c");
  CHECK(split_on_space("a  b") == std::vector<std::string>{"a", "", "b"});
  CHECK(count_words("a\xC2\xA0" "b\xE2\x80\x83 c\x1c" "d ") == 5);  // len(re.split(r"\s+", ...)) in CPython
  CHECK(python_length("h\xC3\xA9llo") == 5);
  CHECK(capitalize_ascii("Hello World") == "Hello world");
}

TEST_CASE("The harness's WikiText detokenizer and HellaSwag cleanup") {
  const std::string page =
      " = Robert Boulter = \n Robert Boulter is an English film , television and theatre actor . He had a guest "
      "@-@ starring role on the television series The Bill in 2000 ( \" Speaking \" ) , 1 @,@ 000 and 3 @.@ 5 ' s ' "
      "hello ' [ a b ] { c } N 's \xC2\xA0( x ) = = = Career = = = \n";
  // wikitext_detokenizer({"page": page}) in lm_eval 0.4.13.
  CHECK(wikitext_detokenize(page) ==
        " = Robert Boulter =\nRobert Boulter is an English film, television and theatre actor. He had a guest-starring "
        "role on the television series The Bill in 2000 (\"Speaking\"), 1,000 and 3.5's' hello '[a b] {c} N's "
        "\xC2\xA0(x) === Career ===\n");
  CHECK(count_words(page) == 70);
  CHECK(hellaswag_preprocess("  Removing ice from car: [title] Then, the man [step] writes  over the snow ") ==
        "Removing ice from car:. Then, the man writes over the snow");
}

TEST_CASE("Python's random.Random(seed): random() and choices()") {
  PythonRandom r0(0);
  CHECK(r0.random() == 0.8444218515250481);
  CHECK(r0.random() == 0.7579544029403025);
  CHECK(PythonRandom(7).random() == 0.32383276483316237);
  PythonRandom r99(99);
  std::vector<int64_t> drawn;
  for (int i = 0; i < 8; ++i) drawn.push_back(r99.choice_index(10));
  CHECK(drawn == std::vector<int64_t>{4, 2, 1, 2, 7, 2, 3, 6});  // Random(99).choices(range(10), k=8)
}

TEST_CASE("Metrics and stderr as lm-evaluation-harness computes them") {
  // bootstrap_stderr(perplexity, xs, iters=3000) and mean_stderr([1, 0, 1, 1, 0]) in lm_eval 0.4.13.
  CHECK(perplexity_bootstrap_stderr({-1.5, -0.25, -3.0, -2.2, -0.9, -4.1, -0.05}, 3000) ==
        Approx(3.561987650434507).epsilon(1e-12));
  CHECK(mean_stderr({1, 0, 1, 1, 0}) == Approx(0.24494897427831783).epsilon(1e-15));
  CHECK(numpy_argmax({1.0, 3.0, 3.0, 2.0}) == 1);

  // Multiple choice: acc takes the largest sum, acc_norm divides by the choice's characters.
  EvalDoc doc;
  doc.choices = {"ab", "abcdefgh"};  // 2 and 8 characters
  doc.gold = 1;
  const std::vector<RequestScore> s = {{-4.0, false}, {-6.0, false}};  // per char: -2 vs -0.75
  auto m = aggregate(TaskKind::kMultipleChoice, {doc, doc}, {s, {{-9.0, false}, {-1.0, true}}}, 100000);
  REQUIRE(m.size() == 2);
  CHECK(m[0].name == "acc");
  CHECK(m[0].value == 0.5);
  CHECK(*m[0].stderr_value == Approx(std::sqrt(0.5) / std::sqrt(2.0)));
  CHECK(m[1].name == "acc_norm");
  CHECK(m[1].value == 1.0);

  // LAMBADA: perplexity = exp(-mean ll), acc = mean is_greedy.
  EvalDoc lam;
  m = aggregate(TaskKind::kLambada, {lam, lam, lam}, {{{-1.0, true}}, {{-2.0, false}}, {{-3.0, true}}}, 0);
  CHECK(m[0].name == "perplexity");
  CHECK(m[0].value == Approx(std::exp(2.0)));
  CHECK(!m[0].stderr_value);  // bootstrap_iters 0: no stderr, as the harness
  CHECK(m[1].value == Approx(2.0 / 3.0));

  // Rolling: weighted by words and bytes; no stderr.
  EvalDoc a, b;
  a.words = 3, a.bytes = 10, b.words = 5, b.bytes = 30;
  m = aggregate(TaskKind::kWikitext, {a, b}, {{{-8.0, false}}, {{-12.0, false}}}, 100000);
  CHECK(m[0].value == Approx(std::exp(20.0 / 8.0)));
  CHECK(m[1].value == Approx(std::exp(20.0 / 40.0)));
  CHECK(m[2].value == Approx(20.0 / 40.0 / std::log(2.0)));
  CHECK(!m[2].stderr_value);
}

TEST_CASE("Requests follow the harness's hf model: pairs, empty contexts, rolling windows") {
  const int64_t eot = gpt2().eod_id();
  // Trailing spaces of the context move to the continuation; the pair is encoded whole.
  TokenRequest r = continuation_request("The cat sat ", "on the mat", gpt2(), eot, 128, "x");
  std::vector<int64_t> want = ids("The cat sat on the mat");
  CHECK(r.tokens == want);
  CHECK(r.scored == static_cast<int64_t>(want.size() - ids("The cat sat").size()));
  // An empty context conditions on <|endoftext|>.
  r = continuation_request("", " hello", gpt2(), eot, 128, "x");
  CHECK(r.tokens.front() == eot);
  CHECK(r.scored == static_cast<int64_t>(ids(" hello").size()));
  // Left truncation to max_length + 1 tokens.
  r = continuation_request("one two three four five six seven", " eight", gpt2(), eot, 4, "x");
  CHECK(r.tokens.size() == 5);
  CHECK(r.tokens.back() == ids(" eight").back());
  CHECK_THROWS_AS(continuation_request("a", " b c d e f g h", gpt2(), eot, 3, "f.jsonl:3"), EvalInputError);

  // Rolling windows of max_length 4 over 10 tokens: the harness's docstring example
  // (BOS 0 1 2 -> 0 1 2 3 | 3 4 5 6 -> 4 5 6 7 | 5 6 7 8 -> 8 9).
  const std::string text = " a b c d e f g h i j";
  const std::vector<int64_t> t = ids(text);
  REQUIRE(t.size() == 10);
  const auto w = rolling_requests(text, gpt2(), eot, 4);
  REQUIRE(w.size() == 3);
  CHECK(w[0].tokens == std::vector<int64_t>{eot, t[0], t[1], t[2], t[3]});
  CHECK(w[0].scored == 4);
  CHECK(w[1].tokens == std::vector<int64_t>{t[3], t[4], t[5], t[6], t[7]});
  CHECK(w[1].scored == 4);
  CHECK(w[2].tokens == std::vector<int64_t>{t[5], t[6], t[7], t[8], t[9]});
  CHECK(w[2].scored == 2);
  CHECK(rolling_requests("", gpt2(), eot, 4).empty());
}

TEST_CASE("Task files: kinds, specs and errors naming file:line and field") {
  const std::string lam = temp_file("lam.jsonl", "{\"text\": \"to be or not\"}\n\n{\"text\": \"word\"}\n");
  EvalTask task = read_task({"l", TaskKind::kLambada, lam});
  REQUIRE(task.docs.size() == 2);
  CHECK(task.docs[0].requests[0].context == "to be or");
  CHECK(task.docs[0].requests[0].continuation == " not");
  CHECK(task.docs[1].requests[0].context.empty());
  CHECK(task.docs[1].line == 3);

  const std::string hs = temp_file("hs.jsonl",
                                   "{\"activity_label\": \"Cars\", \"ctx_a\": \"A man\", \"ctx_b\": \"then HE\", "
                                   "\"endings\": [\"drives [x] off\", \"sits\"], \"label\": \"1\"}\n");
  task = read_task({"h", TaskKind::kHellaswag, hs});
  CHECK(task.docs[0].requests[0].context == "Cars: A man Then he");
  CHECK(task.docs[0].requests[0].continuation == " drives off");
  CHECK(task.docs[0].gold == 1);

  auto message = [](const TaskSpec& spec) {
    try {
      read_task(spec);
    } catch (const EvalInputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string bad_json = temp_file("bad.jsonl", "{\"text\": \"a b\"}\n{\"text\": \n");
  CHECK_THAT(message({"b", TaskKind::kLambada, bad_json}), Catch::Contains(bad_json + ":2: not valid JSON"));
  const std::string wrong_type = temp_file("type.jsonl", "{\"text\": 3}\n");
  CHECK_THAT(message({"b", TaskKind::kLambada, wrong_type}),
             Catch::Contains(":1: field \"text\": expected a string, found a number"));
  const std::string gold = temp_file("gold.jsonl", "{\"context\": \"c\", \"choices\": [\"a\", \"b\"], \"gold\": 2}\n");
  CHECK_THAT(message({"g", TaskKind::kMultipleChoice, gold}),
             Catch::Contains(":1: field \"gold\": gold index 2 is out of range for 2 choices"));
  const std::string empty = temp_file("empty.jsonl", "\n\n");
  CHECK_THAT(message({"e", TaskKind::kRolling, empty}), Catch::Contains("holds no documents"));

  CHECK_THROWS_WITH(parse_task_specs("nope:x.jsonl", "--tasks"), Catch::Contains("unknown task kind 'nope'"));
  CHECK_THROWS_WITH(parse_task_specs("lambada", "--tasks"), Catch::Contains("needs its file: lambada:PATH"));
  CHECK_THROWS_WITH(parse_task_specs("mc:a/x.jsonl,lambada:b/x.jsonl", "--tasks"), Catch::Contains("two tasks are named 'x'"));
  const auto specs = parse_task_specs("mc:a/x.jsonl,mine=lambada:b/x.jsonl", "--tasks");
  CHECK(specs[0].name == "x");
  CHECK(specs[1].name == "mine");
  CHECK(specs[1].kind == TaskKind::kLambada);
  for (const auto& f : {lam, hs, bad_json, wrong_type, gold, empty}) std::filesystem::remove(f);
}

TEST_CASE("Scores equal log_softmax and argmax of the full logits, batched or one at a time") {
  at::NoGradGuard no_grad;
  const model::GptConfig config = generate::test::tiny_config();
  auto groups = runtime::ProcessGroups::single_process();
  model::GptStage stage(config, groups->tensor_ptr());
  generate::test::set_truth(stage, 0, 1);

  std::vector<TokenRequest> requests;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  for (int64_t len : {5, 12, 3, 25, 9, 12}) {
    const at::Tensor t = at::randint(config.vocab_size, {len}, gen, at::kLong);  // host: test data
    requests.push_back({std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len), std::min<int64_t>(len - 1, 4)});
  }
  // One request made the argmax everywhere: its scored labels are the model's own greedy picks.
  {
    std::vector<int64_t> seq = {3, 17, 42};
    for (int i = 0; i < 4; ++i) {
      model::StageInputs in;
      in.tokens = at::tensor(seq, at::kLong).unsqueeze(0);
      in.position_ids = at::arange(static_cast<int64_t>(seq.size()), at::kLong).unsqueeze(0);
      model::DropoutContext off;
      off.training = false;
      const at::Tensor logits = stage.forward(in, off);  // [s, 1, V_padded]
      seq.push_back(logits[-1][0].narrow(0, 0, config.vocab_size).argmax().item<int64_t>());
    }
    requests.push_back({seq, 4});
  }

  for (int64_t batch : {1, 3, 8}) {
    const auto scores = score_requests(stage, *groups, requests, batch);
    REQUIRE(scores.size() == requests.size());
    for (size_t r = 0; r < requests.size(); ++r) {
      const auto& t = requests[r].tokens;
      const int64_t n = static_cast<int64_t>(t.size()) - 1;
      model::StageInputs in;
      in.tokens = at::tensor(std::vector<int64_t>(t.begin(), t.end() - 1), at::kLong).unsqueeze(0);
      in.position_ids = at::arange(n, at::kLong).unsqueeze(0);
      model::DropoutContext off;
      off.training = false;
      const at::Tensor logp = at::log_softmax(stage.forward(in, off).select(1, 0).narrow(1, 0, config.vocab_size), -1);
      double ll = 0;
      bool greedy = true;
      for (int64_t j = n - requests[r].scored; j < n; ++j) {
        ll += logp[j][t[j + 1]].item<double>();
        greedy = greedy && logp[j].argmax().item<int64_t>() == t[j + 1];
      }
      INFO("batch " << batch << " request " << r);
      CHECK(scores[r].loglikelihood == Approx(ll).epsilon(1e-5));
      CHECK(scores[r].greedy == greedy);
    }
    CHECK(scores.back().greedy);
  }
}
