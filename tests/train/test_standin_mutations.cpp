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
#include "model/model_test_util.h"
#include "runtime/run_device.h"
#include "train/pipeline_schedule.h"

using namespace loom;
using Catch::Matchers::Contains;

namespace {

runtime::RunDevice standin_device(int local_rank = 0) {
  test::use_standin_device();
  return runtime::select_run_device(runtime::DeviceKind::kAccelerator, local_rank);
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
    train::run_pipeline_schedule(sc, groups->pipeline_links(), [&](int, int, const at::Tensor&) {
      at::Tensor w = at::ones({4, 1, 8}, at::TensorOptions().device(groups->device())).requires_grad_(true);
      return (w * 2).cpu();  // the mistake: the activation left the device
    });
  } catch (const std::logic_error& e) {
    error = e.what();
  }
  LOOM_WCHECK(error.find("isend on process group 'pipe_link_0_to_1[0]' got a tensor on cpu, expected standin:0") !=
                  std::string::npos, "(got: " + error + ")");
  groups->shutdown();
}

TEST_CASE("a pipeline send of a host activation on the stand-in is refused", "[standin][multiprocess]") {
  test::use_standin_device();
  CHECK(test::run_ranks("standin_pipeline_send_of_host_activation", 2).exit_code() == 0);
}

TEST_CASE("a model forward with host token ids on the stand-in is refused", "[standin]") {
  const auto d = standin_device();
  const model::GptConfig config = model::test::tiny_config();
  model::GptStage stage(config, runtime::Communicator::solo(0, d.device), {}, d.device);
  const auto batch = model::test::make_batch(config, 2);
  model::StageInputs in;
  in.tokens = batch.tokens;  // host ids for a model on the device: the mistake
  in.position_ids = batch.positions;
  model::DropoutContext off;
  off.training = false;
  REQUIRE_THROWS_WITH(stage.forward(in, off), Contains("cpu") && Contains("standin:0"));
  // The same ids on the device run.
  in.tokens = in.tokens.to(d.device);
  in.position_ids = in.position_ids.contiguous().to(d.device);
  at::Tensor logits = stage.forward(in, off);
  CHECK(logits.device() == d.device);
  CHECK(logits.sizes() == at::IntArrayRef({config.seq_length, 2, stage.padded_vocab_size()}));
}

// The lane also keeps NCCL's point-to-point semantics (in order per communicator, a send waits
// for its receive): two stages that each send to the other before receiving on one shared
// communicator deadlock, as on GPUs (the 1F1B steady state), while the per-direction pipeline
// links carry the same traffic.
LOOM_WORKER("standin_crossed_sends") {
  const bool shared = test::env_str("SHARED") == "1";
  auto groups = test::worker_groups(1, 2, std::chrono::seconds(shared ? 4 : 30),
                                    standin_device(test::env_int("LOCAL_RANK")));
  const int me = groups->coords().pp, peer = 1 - me;
  const auto on = at::TensorOptions().device(groups->device());
  at::Tensor out = at::full({1024}, double(me + 1), on), in = at::zeros({1024}, on);
  std::string error;
  try {
    if (shared) {
      auto work = groups->pipeline().isend(out, peer);
      groups->pipeline().recv(in, peer);
      work->wait();
    } else {
      auto work = groups->pipeline_links().isend(out, peer);
      groups->pipeline_links().recv(in, peer);
      work->wait();
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (shared) {
    LOOM_WCHECK(!error.empty(), "(crossed sends on one communicator completed: the stand-in is not strict)");
  } else {
    LOOM_WCHECK(error.empty(), "(" + error + ")");
    LOOM_WCHECK(in.cpu().eq(double(peer + 1)).all().item<bool>());
  }
}

TEST_CASE("on the stand-in, crossed sends on one communicator deadlock and per-direction links do not",
          "[standin][multiprocess]") {
  test::use_standin_device();
  CHECK(test::run_ranks("standin_crossed_sends", 2, {{"SHARED", "1"}}, 60).exit_code() == 0);
  CHECK(test::run_ranks("standin_crossed_sends", 2, {{"SHARED", "0"}}, 60).exit_code() == 0);
}
