// The stand-in device: registration, bit-identity with CPU (a GPT-like block in fp32 and bf16,
// forward, backward and AdamW steps; a torch::nn module moved with .to), device checks, pinned
// memory, memory counters and serialization. The communicator: test_standin_comm.cpp.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/Parallel.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/torch.h>

#define LOOM_STANDIN_MAIN_TU
#include "test_common.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

using standin_test::contains;
using standin_test::error_of;
using standin_test::plugin;
using standin_test::same_bits;
using standin_test::standin;

namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

at::Generator cpu_generator(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

// A generator for `device` seeded with `seed` (a CPU one for the CPU).
at::Generator generator_for(const c10::Device& device, uint64_t seed) {
  if (device.is_cpu()) return cpu_generator(seed);
  at::Generator g = at::detail::getPrivateUse1Hooks().getNewGenerator(device.index());
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(seed);
  return g;
}

void compare(const Named& cpu, const Named& dev, const c10::Device& device) {
  REQUIRE(cpu.size() == dev.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO(cpu[i].first);
    CHECK(cpu[i].first == dev[i].first);
    CHECK(dev[i].second.device() == device);
    const bool same = same_bits(cpu[i].second, dev[i].second);
    if (!same && cpu[i].second.sizes() == dev[i].second.sizes()) {
      INFO("max |difference| = " << (cpu[i].second.to(at::kDouble) -
                                     dev[i].second.cpu().to(at::kDouble))
                                        .abs()
                                        .max()
                                        .item<double>());
      CHECK(same);
    } else {
      CHECK(same);
    }
  }
}

// A GPT-like block (embeddings, pre-LN attention with causal softmax and dropout, GeLU MLP,
// final LN, tied logits, cross entropy), forward and backward, then AdamW steps written with
// ATen ops; every output, gradient and updated parameter is returned.
Named run_block(const c10::Device& device, at::ScalarType dtype) {
  plugin();   // before the first backward of the process: see README (autograd's device queues)
  constexpr int64_t B = 2, T = 8, H = 32, NH = 2, HD = H / NH, V = 64;
  constexpr double kLr = 1e-2, kB1 = 0.9, kB2 = 0.95, kEps = 1e-8, kWd = 0.1;
  at::Generator init = cpu_generator(1234);
  auto randn = [&](at::IntArrayRef sizes, double scale) {
    return (at::randn(sizes, init, at::kFloat) * scale).to(dtype).to(device);
  };
  auto ones = [&](int64_t n) { return at::ones({n}, at::kFloat).to(dtype).to(device); };
  auto zeros = [&](int64_t n) { return at::zeros({n}, at::kFloat).to(dtype).to(device); };
  Named params = {
      {"wte", randn({V, H}, 0.02)},     {"wpe", randn({T, H}, 0.02)},
      {"ln1_w", ones(H)},               {"ln1_b", zeros(H)},
      {"w_qkv", randn({3 * H, H}, 0.02)}, {"b_qkv", randn({3 * H}, 0.02)},
      {"w_proj", randn({H, H}, 0.02)},  {"b_proj", randn({H}, 0.02)},
      {"ln2_w", ones(H)},               {"ln2_b", zeros(H)},
      {"w_fc", randn({4 * H, H}, 0.02)}, {"b_fc", randn({4 * H}, 0.02)},
      {"w_out", randn({H, 4 * H}, 0.02)}, {"b_out", randn({H}, 0.02)},
      {"lnf_w", ones(H)},               {"lnf_b", zeros(H)},
  };
  for (auto& [name, p] : params) p.requires_grad_(true);
  auto P = [&](const char* name) -> at::Tensor& {
    for (auto& [n, p] : params)
      if (n == name) return p;
    throw std::logic_error(name);
  };
  at::Tensor tokens = at::randint(V, {B, T}, init, at::kLong).to(device);
  at::Tensor targets = at::randint(V, {B, T}, init, at::kLong).to(device);
  std::vector<at::Tensor> m, v;
  for (auto& [n, p] : params) {
    m.push_back(at::zeros_like(p).detach());
    v.push_back(at::zeros_like(p).detach());
  }
  at::manual_seed(77);   // at::dropout draws from the default generator (the CPU's)
  at::Generator drop = generator_for(device, 99);

  Named out;
  for (int step = 1; step <= 3; ++step) {
    at::Tensor pos = at::arange(T, at::TensorOptions().dtype(at::kLong).device(device));
    at::Tensor x = at::embedding(P("wte"), tokens) + at::embedding(P("wpe"), pos);
    at::Tensor h = at::layer_norm(x, {H}, P("ln1_w"), P("ln1_b"), 1e-5);
    auto qkv = at::linear(h, P("w_qkv"), P("b_qkv")).split(H, -1);
    auto heads = [&](const at::Tensor& t) { return t.view({B, T, NH, HD}).transpose(1, 2); };
    at::Tensor q = heads(qkv[0]), k = heads(qkv[1]), vv = heads(qkv[2]);
    at::Tensor att = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(HD)));
    at::Tensor causal =
        at::ones({T, T}, at::TensorOptions().dtype(at::kBool).device(device)).triu(1);
    att = at::softmax(att.masked_fill(causal, -std::numeric_limits<double>::infinity()), -1);
    at::Tensor keep = at::empty_like(att).bernoulli_(0.9, drop);   // explicit generator
    at::Tensor dropped = att * keep / 0.9;
    at::Tensor y = at::matmul(dropped, vv).transpose(1, 2).contiguous().view({B, T, H});
    y = at::dropout(at::linear(y, P("w_proj"), P("b_proj")), 0.1, /*train=*/true);
    x = x + y;
    h = at::layer_norm(x, {H}, P("ln2_w"), P("ln2_b"), 1e-5);
    h = at::linear(at::gelu(at::linear(h, P("w_fc"), P("b_fc"))), P("w_out"), P("b_out"));
    x = at::layer_norm(x + h, {H}, P("lnf_w"), P("lnf_b"), 1e-5);
    at::Tensor logits = at::matmul(x, P("wte").t());
    at::Tensor loss = at::cross_entropy_loss(logits.view({B * T, V}), targets.view({-1}));
    loss.backward();

    const std::string s = "step " + std::to_string(step) + " ";
    out.emplace_back(s + "loss", loss.detach());
    if (step == 1) {
      out.emplace_back(s + "logits", logits.detach());
      out.emplace_back(s + "attention probs", att.detach());
      out.emplace_back(s + "dropout keep mask", keep);
    }
    at::NoGradGuard no_grad;
    const double bc1 = 1 - std::pow(kB1, step), bc2 = 1 - std::pow(kB2, step);
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor& p = params[i].second;
      at::Tensor g = p.grad();
      out.emplace_back(s + "grad " + params[i].first, g.clone());
      m[i].mul_(kB1).add_(g, 1 - kB1);
      v[i].mul_(kB2).addcmul_(g, g, 1 - kB2);
      p.mul_(1 - kLr * kWd);
      p.addcdiv_(m[i], (v[i] / bc2).sqrt_().add_(kEps), -kLr / bc1);
      p.mutable_grad().zero_();
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    out.emplace_back("final " + params[i].first, params[i].second.detach());
    out.emplace_back("final adam m " + params[i].first, m[i]);
    out.emplace_back("final adam v " + params[i].first, v[i]);
  }
  return out;
}

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})));
    fc2 = register_module("fc2", torch::nn::Linear(32, 8));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::gelu(ln(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm ln{nullptr};
};

// A custom op library, as Loom's extensions register theirs: CPU kernels and a composite.
std::atomic<int> g_cpu_kernel_calls{0};

at::Tensor scale_add_cpu(const at::Tensor& x, const at::Tensor& y, double a) {
  TORCH_CHECK(x.is_cpu() && y.is_cpu(), "scale_add's CPU kernel got ", x.device());
  ++g_cpu_kernel_calls;
  return x + y * a;
}

at::Tensor& fill_out_cpu(at::Tensor& out, double v) {
  TORCH_CHECK(out.is_cpu(), "fill_out's CPU kernel got ", out.device());
  return out.fill_(v);
}

// Routed by the stand-in to the CPU, so it sees CPU tensors only.
at::Tensor twice_composite(const at::Tensor& x) {
  TORCH_CHECK(x.is_cpu(), "twice's composite ran on ", x.device());
  return x * 2;
}

}  // namespace

TORCH_LIBRARY(standin_test, m) {
  m.def("scale_add(Tensor x, Tensor y, float a) -> Tensor");
  m.def("fill_out(Tensor(a!) out, float v) -> Tensor(a!)");
  m.def("twice(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(standin_test, CPU, m) {
  m.impl("scale_add", &scale_add_cpu);
  m.impl("fill_out", &fill_out_cpu);
}
TORCH_LIBRARY_IMPL(standin_test, CompositeExplicitAutograd, m) {
  m.impl("twice", &twice_composite);
}

TEST_CASE("standin: custom ops of other namespaces run their CPU kernels", "[standin]") {
  const c10::Device dev = standin(0);
  auto& d = c10::Dispatcher::singleton();
  auto scale_add = d.findSchemaOrThrow("standin_test::scale_add", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  auto fill_out =
      d.findSchemaOrThrow("standin_test::fill_out", "").typed<at::Tensor&(at::Tensor&, double)>();
  auto twice = d.findSchemaOrThrow("standin_test::twice", "").typed<at::Tensor(const at::Tensor&)>();
  at::Tensor x = at::randn({3, 4}, cpu_generator(21)), y = at::randn({3, 4}, cpu_generator(22));
  const int calls = g_cpu_kernel_calls.load();
  at::Tensor r = scale_add.call(x.to(dev), y.to(dev), 0.5);
  CHECK(g_cpu_kernel_calls.load() == calls + 1);
  CHECK(r.device() == dev);
  CHECK(same_bits(r, scale_add.call(x, y, 0.5)));
  at::Tensor out = at::empty({2, 2}, at::TensorOptions().device(dev));
  at::Tensor& same = fill_out.call(out, 4.0);
  CHECK(same.is_same(out));
  CHECK(same_bits(out, at::full({2, 2}, 4.0)));
  CHECK(same_bits(twice.call(x.to(dev)), x * 2));   // the composite was routed to the CPU
  const std::string e = error_of([&] { scale_add.call(x.to(dev), y, 1.0); });
  INFO(e);
  CHECK(contains(e, "standin: standin_test::scale_add got an argument on cpu, expected standin:0"));

  // Tensor lists, in and out.
  at::Tensor a = at::randn({2, 3}, cpu_generator(23)), b = at::randn({1, 3}, cpu_generator(24));
  CHECK(same_bits(at::cat({a.to(dev), b.to(dev)}), at::cat({a, b})));
  std::vector<at::Tensor> list{a.to(dev), b.to(dev)};
  at::_foreach_add_(list, 1.5);
  CHECK(same_bits(list[0], a + 1.5));
  CHECK(same_bits(list[1], b + 1.5));
  auto parts = at::randn({6, 2}, cpu_generator(25)).to(dev).split(2);
  CHECK(parts.size() == 3);
  CHECK(parts[2].device() == dev);
}

TEST_CASE("standin: the library registers the device when loaded", "[standin]") {
  const auto& p = plugin();
  REQUIRE(p.handle != nullptr);
  CHECK(std::string(p.name()) == "standin");
  CHECK(p.make_backend != nullptr);
  CHECK(c10::get_privateuse1_backend() == "standin");
  CHECK(c10::Device("standin:1") == standin(1));
  CHECK(p.device_count() == 16);   // LOOM_STANDIN_DEVICE_COUNT unset in tests
  CHECK(at::detail::getPrivateUse1Hooks().deviceCount() == 16);

  at::Tensor t = at::ones({2, 3}, at::TensorOptions().device(standin(0)));
  CHECK(c10::str(t.device()) == "standin:0");
  CHECK(t.is_privateuseone());
  std::ostringstream printed;
  printed << t;   // printing copies to the host
  CHECK(contains(printed.str(), "1"));
  CHECK(t.sum().item<float>() == 6.0f);

  // With the stand-in loaded, PrivateUse1 is the accelerator, also in this CUDA build of torch.
  auto acc = at::getAccelerator(false);
  REQUIRE(acc.has_value());
  CHECK(*acc == c10::DeviceType::PrivateUse1);
  INFO("hasCUDA() = " << at::globalContext().hasCUDA());

  // A registration that stopped working in a torch upgrade fails here first.
  auto& d = c10::Dispatcher::singleton();
  for (const char* op : {"aten::native_layer_norm", "aten::embedding", "aten::_to_copy"}) {
    auto h = d.findOp({op, ""});
    REQUIRE(h.has_value());
    INFO(op);
    // native_layer_norm and embedding: routed from their composites to the CPU kernels.
    const bool routed = h->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1);
    CHECK(routed == (std::string(op) != "aten::_to_copy"));
  }
  CHECK_FALSE(error_of([] { at::empty({1}, at::TensorOptions().device(standin(40))); }).empty());
  // Everything was routed at load time (this binary's own op library included): nothing left.
  auto* reroute = reinterpret_cast<int64_t (*)()>(dlsym(p.handle, "loom_standin_reroute_composites"));
  REQUIRE(reroute != nullptr);
  CHECK(reroute() == 0);

  // The hooks: the device of a pointer (into a block, into a kernel's result), generators.
  const auto& hooks = at::detail::getPrivateUse1Hooks();
  at::Tensor on2 = at::zeros({16}, at::TensorOptions().device(standin(2)));
  CHECK(hooks.getDeviceFromPtr(on2.data_ptr<float>() + 3) == standin(2));
  at::Tensor sum2 = on2 + 1;   // memory made by the CPU kernel, adopted by standin:2
  CHECK(hooks.getDeviceFromPtr(sum2.data_ptr()) == standin(2));
  CHECK_FALSE(error_of([&] { hooks.getDeviceFromPtr(at::ones({4}).data_ptr()); }).empty());
  CHECK(hooks.getDefaultGenerator(1).device() == standin(1));
  CHECK(at::globalContext().defaultGenerator(standin(3)).device() == standin(3));
}

TEST_CASE("standin: a backward reduction split across threads matches CPU", "[standin]") {
  plugin();
  // Large enough that the sum is split across the intra-op threads, whose number changes the
  // rounding: the backward on standin runs on autograd's device thread and must use as many.
  at::Tensor x = at::randn({1 << 22}, cpu_generator(11));
  at::Tensor grads[2];
  int i = 0;
  for (const c10::Device& device : {c10::Device(c10::kCPU), standin(0)}) {
    at::Tensor w = at::ones({1}, at::TensorOptions().device(device)).requires_grad_(true);
    (x.to(device) * w).sum().backward();
    grads[i++] = w.grad();
  }
  INFO("intra-op threads " << at::get_num_threads());
  CHECK(grads[1].device() == standin(0));
  CHECK(same_bits(grads[0], grads[1]));
}

TEST_CASE("standin: a GPT block trains bit-identically to CPU", "[standin]") {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO("dtype " << dtype);
    Named on_cpu = run_block(c10::Device(c10::kCPU), dtype);
    Named on_dev = run_block(standin(0), dtype);
    compare(on_cpu, on_dev, standin(0));
  }
}

TEST_CASE("standin: scaled dot product attention takes the CPU's algorithm", "[standin]") {
  plugin();
  at::Generator g = cpu_generator(5);
  at::Tensor q = at::randn({2, 2, 16, 8}, g), k = at::randn({2, 2, 16, 8}, g),
             v = at::randn({2, 2, 16, 8}, g), grad = at::randn({2, 2, 16, 8}, g);
  Named results[2];
  int i = 0;
  for (const c10::Device& device : {c10::Device(c10::kCPU), standin(0)}) {
    auto leaf = [&](const at::Tensor& t) { return t.to(device, false, true).requires_grad_(true); };
    at::Tensor qd = leaf(q), kd = leaf(k), vd = leaf(v);
    at::Tensor o = at::scaled_dot_product_attention(qd, kd, vd, {}, 0.0, /*is_causal=*/true);
    o.backward(grad.to(device));
    results[i++] = {{"out", o.detach()}, {"dq", qd.grad()}, {"dk", kd.grad()}, {"dv", vd.grad()}};
  }
  compare(results[0], results[1], standin(0));
}

TEST_CASE("standin: a torch::nn module moved with .to trains like on CPU", "[standin]") {
  plugin();
  torch::manual_seed(5);
  auto cpu_net = std::make_shared<Net>();
  torch::manual_seed(5);
  auto dev_net = std::make_shared<Net>();
  dev_net->to(standin(0));
  for (const auto& p : dev_net->parameters()) CHECK(p.device() == standin(0));
  torch::optim::AdamW cpu_opt(cpu_net->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW dev_opt(dev_net->parameters(), torch::optim::AdamWOptions(1e-2));
  at::Tensor x = at::randn({4, 16}, cpu_generator(8));
  Named a, b;
  for (int step = 0; step < 3; ++step) {
    for (auto [net, opt, input, out] :
         {std::make_tuple(cpu_net.get(), &cpu_opt, x, &a),
          std::make_tuple(dev_net.get(), &dev_opt, x.to(standin(0)), &b)}) {
      opt->zero_grad();
      at::Tensor y = net->forward(input);
      at::Tensor loss = y.pow(2).mean();
      loss.backward();
      opt->step();
      out->emplace_back("loss " + std::to_string(step), loss.detach());
    }
  }
  auto pa = cpu_net->named_parameters(), pb = dev_net->named_parameters();
  for (const auto& item : pa) a.emplace_back(item.key(), item.value().detach());
  for (const auto& item : pb) b.emplace_back(item.key(), item.value().detach());
  compare(a, b, standin(0));

  dev_net->to(c10::Device(c10::kCPU));
  for (const auto& p : dev_net->parameters()) CHECK(p.device().is_cpu());
}

TEST_CASE("standin: host tensors where device tensors belong are refused", "[standin]") {
  const c10::Device dev = standin(0);
  at::Tensor host = at::ones({2, 3});
  at::Tensor on_dev = at::ones({2, 3}, at::TensorOptions().device(dev));

  std::string e = error_of([&] { at::add(host, on_dev); });
  INFO(e);
  CHECK(contains(e, "standin: aten::add.Tensor got an argument on cpu, expected standin:0 "
                    "(a CUDA kernel would refuse it too)"));

  at::Tensor weight = at::randn({10, 4}).to(dev);
  at::Tensor host_ids = at::tensor({1, 2, 3}, at::kLong);
  e = error_of([&] { at::embedding(weight, host_ids); });
  INFO(e);
  CHECK(contains(e, "standin: aten::embedding got an argument on cpu, expected standin:0"));
  CHECK(contains(e, "'indices'"));

  e = error_of([&] { at::matmul(at::ones({3, 2}), on_dev); });
  INFO(e);
  CHECK(contains(e, "got an argument on cpu, expected standin:0"));

  at::Tensor on_dev1 = at::ones({2, 3}, at::TensorOptions().device(standin(1)));
  e = error_of([&] { at::mul(on_dev, on_dev1); });
  INFO(e);
  CHECK(contains(e, "got an argument on standin:1, expected standin:0"));

  e = error_of([&] { at::cat({on_dev, host}); });
  CHECK(contains(e, "got an argument on cpu, expected standin:0"));

  e = error_of([&] { on_dev.bernoulli_(0.5, cpu_generator(1)); });
  INFO(e);
  CHECK(contains(e, "got a generator on cpu, expected standin:0"));

  // set_ onto host memory: CUDA refuses it too.
  e = error_of([&] { at::empty({0}, at::TensorOptions().device(dev)).set_(host.storage()); });
  INFO(e);
  CHECK(contains(e, "got a storage on cpu, expected standin:0"));

  // Allowed, as on CUDA: host scalars (0-dim), copies between devices, host index tensors.
  at::Tensor two = at::scalar_tensor(2.0);
  CHECK(same_bits(at::add(on_dev, two), at::add(at::ones({2, 3}), two)));
  CHECK(same_bits(on_dev * at::scalar_tensor(3.0), at::full({2, 3}, 3.0)));
  at::Tensor copy = at::empty({2, 3}, at::TensorOptions().device(dev));
  copy.copy_(host);
  CHECK(same_bits(copy, host));
  host.copy_(on_dev1);
  CHECK(same_bits(on_dev.index({at::tensor({1, 0}, at::kLong)}), at::ones({2, 3})));
}

TEST_CASE("standin: views, in-place and out= ops write device memory", "[standin]") {
  const c10::Device dev = standin(0);
  at::Tensor base = at::arange(12, at::TensorOptions().dtype(at::kFloat)).view({3, 4});
  at::Tensor x = base.to(dev);
  at::Tensor view = x.t();
  view.add_(1);                       // through the fallback, into x's memory
  x.select(0, 1).mul_(2);             // view of a view
  base.t().add_(1);
  base.select(0, 1).mul_(2);
  CHECK(same_bits(x, base));
  at::Tensor row = x.unfold(1, 2, 2);  // a view made by a CPU kernel (no composite)
  CHECK(row.device() == dev);
  row.zero_();
  CHECK(x.abs().sum().item<float>() == 0.0f);

  at::Tensor out = at::empty({0}, at::TensorOptions().device(dev));
  at::add_out(out, at::ones({5}).to(dev), at::full({5}, 2.0).to(dev));   // resizes `out`
  CHECK(out.sizes() == at::IntArrayRef({5}));
  CHECK(same_bits(out, at::full({5}, 3.0)));
  at::Tensor u = at::zeros({3}, at::TensorOptions().device(dev));
  u.unsqueeze_(0);                    // metadata change by a CPU kernel
  CHECK(u.sizes() == at::IntArrayRef({1, 3}));
  at::Tensor big = at::empty({2}, at::TensorOptions().device(dev)).fill_(7);
  big.resize_({4, 4});
  CHECK(big.numel() == 16);
  CHECK(big.view({-1}).slice(0, 0, 2).sum().item<float>() == 14.0f);
  auto [values, indices] = at::ones({4, 3}).to(dev).max(1);
  CHECK(values.device() == dev);
  CHECK(indices.device() == dev);
  CHECK(at::arange(4, at::TensorOptions().device(dev)).sum().item<int64_t>() == 6);
  at::Tensor masked = x.to(at::kLong).masked_select(x.ge(0));
  CHECK(masked.device() == dev);
  x.record_stream(c10::Stream(c10::Stream::DEFAULT, dev));

  // Copies keep the layout (empty_strided), set_ and storage resizes go through the kernels.
  at::Tensor strided = at::randn({4, 6}).t().to(dev);
  CHECK(strided.strides() == at::IntArrayRef({1, 6}));
  at::Tensor src = at::arange(10, at::TensorOptions().dtype(at::kFloat)).to(dev);
  at::Tensor s1 = at::empty({0}, at::TensorOptions().device(dev));
  s1.set_(src.storage(), 2, {2, 3}, {3, 1});
  CHECK(same_bits(s1, at::arange(2, 8, at::kFloat).view({2, 3})));
  at::Tensor s2 = at::empty({0}, at::TensorOptions().device(dev));
  s2.set_(src);
  CHECK(s2.is_alias_of(src));
  s2.set_();
  CHECK(s2.numel() == 0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  const bool nan_filled = at::empty({4}, at::TensorOptions().device(dev)).isnan().all().item<bool>();
  at::globalContext().setDeterministicAlgorithms(false, false);
  CHECK(nan_filled);   // as the CPU fills new memory under deterministic algorithms
  at::native::resize_bytes_nocuda(src.storage(), 80);   // the hooks' resize
  CHECK(src.storage().nbytes() == 80);
  CHECK(same_bits(src, at::arange(10, at::TensorOptions().dtype(at::kFloat))));
}

TEST_CASE("standin: pinned host memory, non_blocking copies and memory counters", "[standin]") {
  const auto& p = plugin();
  const c10::Device dev = standin(0);
  at::Tensor pinned = at::empty({1024}, at::TensorOptions().pinned_memory(true));
  CHECK(pinned.is_pinned());
  pinned.copy_(at::arange(1024, at::kFloat));
  at::Tensor on_dev = pinned.to(dev, /*non_blocking=*/true);
  CHECK(on_dev.device() == dev);
  CHECK(same_bits(on_dev, pinned));
  at::Tensor host = at::ones({8});
  CHECK_FALSE(host.is_pinned());
  at::Tensor again = host.pin_memory();
  CHECK(again.is_pinned());
  CHECK_FALSE(on_dev.is_pinned());
  at::Tensor back = at::empty({1024}, at::TensorOptions().pinned_memory(true));
  back.copy_(on_dev, /*non_blocking=*/true);
  CHECK(same_bits(back, pinned));

  for (int d : {0, 3}) {
    INFO("standin:" << d);
    const int64_t before = p.current_bytes(d);
    p.reset_peak(d);
    CHECK(p.peak_bytes(d) == before);
    {
      at::Tensor a = at::empty({1 << 18}, at::TensorOptions().device(standin(d)));   // 1 MiB
      CHECK(p.current_bytes(d) == before + (1 << 20));
      at::Tensor b = a.fill_(1).add(1);   // a CPU kernel's result, kept on the device
      CHECK(b.device() == standin(d));
      CHECK(p.current_bytes(d) == before + (2 << 20));
      CHECK(p.peak_bytes(d) == before + (2 << 20));
    }
    CHECK(p.current_bytes(d) == before);
    CHECK(p.peak_bytes(d) == before + (2 << 20));
    // The same numbers through c10::DeviceAllocator, as Loom's runtime reads CUDA's.
    auto* allocator = c10::getDeviceAllocator(c10::DeviceType::PrivateUse1);
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    auto stats = allocator->getDeviceStats(static_cast<c10::DeviceIndex>(d));
    CHECK(stats.allocated_bytes[all].peak == before + (2 << 20));
    CHECK(stats.allocated_bytes[all].current == before);
    allocator->resetPeakStats(static_cast<c10::DeviceIndex>(d));
    CHECK(p.peak_bytes(d) == before);
    CHECK(allocator->getDeviceStats(static_cast<c10::DeviceIndex>(d)).allocated_bytes[all].peak ==
          before);
    p.reset_peak(d);
    CHECK(p.peak_bytes(d) == before);
  }
  CHECK_FALSE(error_of([&] { p.peak_bytes(99); }).empty());
}

TEST_CASE("standin: a .cpu() copy serializes like the CPU tensor", "[standin]") {
  at::Tensor t = at::randn({3, 5}, cpu_generator(3)).to(at::kBFloat16);
  at::Tensor on_dev = t.to(standin(0));
  std::vector<char> a = torch::pickle_save(t);
  at::Tensor host_copy = on_dev.cpu();   // held like `t` (the pickler memoizes shared values)
  std::vector<char> b = torch::pickle_save(host_copy);
  CHECK(a == b);
  at::Tensor loaded = torch::pickle_load(b).toTensor();
  CHECK(same_bits(loaded, t));
  CHECK(same_bits(loaded.to(standin(0)), on_dev));
}
