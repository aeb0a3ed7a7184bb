#include "model/activation_memory.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

namespace loom::model {

struct ActivationMemoryRecorder::Impl {
  struct Entry {
    c10::Storage storage;  // held so that a freed address cannot be counted twice
    int scope;
    SavedBytes size;
    std::string what;
  };
  std::set<const void*> excluded;
  std::map<const void*, size_t> seen;  // storage impl -> entries index
  std::vector<Entry> entries;

  void record(const at::Tensor& t);
};

namespace {

thread_local ActivationMemoryRecorder::Impl* tls_recorder = nullptr;
thread_local int tls_scope = kOutsideLayers;

struct RecordingHooks : torch::autograd::SavedVariableHooks {
  void call_pack_hook(const at::Tensor& tensor) override {
    if (tls_recorder != nullptr) tls_recorder->record(tensor);
    saved_ = tensor.detach();  // no autograd metadata: no reference cycle through grad_fn
  }
  at::Tensor call_unpack_hook() override { return saved_; }

 private:
  at::Tensor saved_;
};

// The default engine, except that it hands out recording hooks while a recorder is active.
struct RecordingEngine : torch::autograd::Engine {
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (tls_recorder == nullptr) return nullptr;
    return std::make_unique<RecordingHooks>();
  }
};

torch::autograd::Engine& recording_engine() {
  static auto* engine = new RecordingEngine();  // lives for the process, like the base engine
  return *engine;
}

void install_recording_engine() {
  static std::once_flag once;
  std::call_once(once, [] { torch::autograd::set_default_engine_stub(&recording_engine); });
}

}  // namespace

SavedBytes& SavedBytes::operator+=(const SavedBytes& o) {
  bytes += o.bytes;
  paper_bytes += o.paper_bytes;
  storages += o.storages;
  return *this;
}

void ActivationMemoryRecorder::Impl::record(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  const void* key = t.storage().unsafeGetStorageImpl();
  if (excluded.count(key) || seen.count(key)) return;
  const int64_t bytes = static_cast<int64_t>(t.storage().nbytes());
  const int64_t item = static_cast<int64_t>(t.element_size());
  SavedBytes size;
  size.bytes = bytes;
  size.paper_bytes = at::isFloatingType(t.scalar_type()) ? bytes / item * 2 : bytes;
  size.storages = 1;
  std::ostringstream what;
  what << t.scalar_type() << " " << t.sizes() << " (storage " << bytes << " bytes)";
  seen[key] = entries.size();
  entries.push_back({t.storage(), tls_scope, size, what.str()});
}

ActivationMemoryRecorder::ActivationMemoryRecorder(const ParamList& exclude)
    : impl_(std::make_unique<Impl>()) {
  if (tls_recorder != nullptr)
    throw std::logic_error("ActivationMemoryRecorder: a recorder is already active on this thread");
  install_recording_engine();
  for (const auto& p : exclude)
    if (p.tensor.defined() && p.tensor.has_storage())
      impl_->excluded.insert(p.tensor.storage().unsafeGetStorageImpl());
  tls_recorder = impl_.get();
}

ActivationMemoryRecorder::~ActivationMemoryRecorder() {
  if (tls_recorder == impl_.get()) tls_recorder = nullptr;
}

std::map<int, SavedBytes> ActivationMemoryRecorder::per_scope() const {
  std::map<int, SavedBytes> out;
  for (const auto& e : impl_->entries) out[e.scope] += e.size;
  return out;
}

SavedBytes ActivationMemoryRecorder::total() const {
  SavedBytes sum;
  for (const auto& e : impl_->entries) sum += e.size;
  return sum;
}

std::vector<std::string> ActivationMemoryRecorder::describe() const {
  std::vector<std::string> lines;
  for (const auto& e : impl_->entries)
    lines.push_back((e.scope == kOutsideLayers ? std::string("outside layers")
                                               : "layer " + std::to_string(e.scope)) +
                    ": " + e.what);
  return lines;
}

ActivationScope::ActivationScope(int layer) : previous_(tls_scope) { tls_scope = layer; }
ActivationScope::~ActivationScope() { tls_scope = previous_; }

}  // namespace loom::model
