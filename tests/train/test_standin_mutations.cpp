// The stand-in device lane bites (docs/design/devices.md): on a non-CPU device, a host tensor
// handed to a collective, to a pipeline send or to a model forward fails with a message that
// names the operation, the tensor's device and the expected one — the mistakes that pass
// unnoticed on CPU ranks, where every tensor is on the right device by accident.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "harness/multiprocess.h"
#include "harness/standin_device.h"
#include "harness/worker_groups.h"
#include "model/gpt_stage.h"
#include "runtime/run_device.h"
#include "train/pipeline_schedule.h"

using namespace loom;
using Catch::Matchers::Contains;

namespace {

runtime::RunDevice standin_device(int local_rank = 0) {
  test::use_standin_device();
  return runtime::select_run_device(runtime::DeviceKind::kAccelerator, local_rank);
}

model::GptConfig tiny_config() {
  model::GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.vocab_size = 64;
  c.max_position_embeddings = 8;
  c.seq_length = 8;
  return c;
}

}  // namespace

TEST_CASE("an accelerator run lands on the stand-in device with its communicator", "[standin]") {
  const auto d = standin_device(1);
  CHECK(d.device == at::Device(c10::DeviceType::PrivateUse1, 1));
  CHECK(d.collectives == runtime::Collectives::kPlugin);
  CHECK_THAT(d.describe(), Contains("standin:1") && Contains("libloom_standin_device.so"));
}

TEST_CASE("a host tensor given to a collective on the stand-in is refused", "[standin]") {
  const auto d = standin_device();
  auto group = runtime::Communicator::solo(0, d.device);
  at::Tensor host = at::ones({4});
  REQUIRE_THROWS_WITH(group->all_reduce(host),
                      Contains("all_reduce on process group 'solo' got a tensor on cpu, expected standin:0"));
  at::Tensor flag = at::ones({1}, at::TensorOptions().dtype(at::kBool).device(d.device));
  REQUIRE_THROWS_WITH(group->all_reduce(flag), Contains("Bool") && Contains("NCCL has no bool"));
  at::Tensor ok = at::ones({4}, at::TensorOptions().device(d.device));
  REQUIRE_NOTHROW(group->all_reduce(ok));
}

LOOM_WORKER("standin_collective_of_host_tensor") {
  auto groups = test::worker_groups(2, 1, std::chrono::seconds(20), standin_device(test::env_int("LOCAL_RANK")));
  at::Tensor host = at::ones({4});
  std::string error;
  try {
    groups->tensor().all_reduce(host);
  } catch (const std::logic_error& e) {
    error = e.what();
  }
  LOOM_WCHECK(error.find("all_reduce on process group 'tensor[0]' got a tensor on cpu, expected standin:") !=
                  std::string::npos, "(got: " + error + ")");
  at::Tensor ok = at::full({4}, double(groups->rank() + 1), at::TensorOptions().device(groups->device()));
  groups->tensor().all_reduce(ok);  // the group still works
  LOOM_WCHECK(ok.cpu().eq(3.0).all().item<bool>());
  groups->shutdown();
}

TEST_CASE("on 2 stand-in ranks a host tensor given to a collective is refused", "[standin][multiprocess]") {
  test::use_standin_device();
  CHECK(test::run_ranks("standin_collective_of_host_tensor", 2).exit_code() == 0);
}

LOOM_WORKER("standin_pipeline_send_of_host_activation") {
  auto groups = test::worker_groups(1, 2, std::chrono::seconds(20), standin_device(test::env_int("LOCAL_RANK")));
  if (groups->coords().pp == 1) {  // the receiving stage is never reached
    groups->shutdown();
    return;
  }
  train::ScheduleConfig sc;
  sc.num_microbatches = 1;
  sc.activation_shape = {4, 1, 8};
  sc.activation_device = groups->device();
  std::string error;
  try {
    train::run_pipeline_schedule(sc, groups->pipeline(), [&](int, int, const at::Tensor&) {
      at::Tensor w = at::ones({4, 1, 8}, at::TensorOptions().device(groups->device())).requires_grad_(true);
      return (w * 2).cpu();  // the mistake: the activation left the device
    });
  } catch (const std::logic_error& e) {
    error = e.what();
  }
  LOOM_WCHECK(error.find("isend on process group 'pipeline[0]' got a tensor on cpu, expected standin:0") !=
                  std::string::npos, "(got: " + error + ")");
  groups->shutdown();
}

TEST_CASE("a pipeline send of a host activation on the stand-in is refused", "[standin][multiprocess]") {
  test::use_standin_device();
  CHECK(test::run_ranks("standin_pipeline_send_of_host_activation", 2).exit_code() == 0);
}

TEST_CASE("a model forward with host token ids on the stand-in is refused", "[standin]") {
  const auto d = standin_device();
  model::GptStage stage(tiny_config(), runtime::Communicator::solo(0, d.device), {}, d.device);
  model::StageInputs in;
  in.tokens = at::randint(0, 64, {2, 8}, at::TensorOptions().dtype(at::kLong));  // host: the mistake
  in.position_ids = at::arange(8, at::TensorOptions().dtype(at::kLong)).expand({2, 8});
  model::DropoutContext off;
  off.training = false;
  REQUIRE_THROWS_WITH(stage.forward(in, off), Contains("cpu") && Contains("standin:0"));
  // The same ids on the device run.
  in.tokens = in.tokens.to(d.device);
  in.position_ids = in.position_ids.contiguous().to(d.device);
  at::Tensor logits = stage.forward(in, off);
  CHECK(logits.device() == d.device);
  CHECK(logits.sizes() == at::IntArrayRef({8, 2, stage.padded_vocab_size()}));
}
