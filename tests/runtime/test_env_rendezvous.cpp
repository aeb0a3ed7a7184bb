// Environment parsing for torchrun, torchrun with the agent store, Slurm and single process.
#include <catch2/catch.hpp>

#include <map>

#include "launch/env_rendezvous.h"

using loom::launch::RendezvousSource;
using loom::launch::rendezvous_from_env;

static loom::launch::EnvLookup fake(std::map<std::string, std::string> vars) {
  return [vars](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST_CASE("torchrun environment", "[env]") {
  auto info = rendezvous_from_env(fake({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                        {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node7"},
                                        {"MASTER_PORT", "29400"}, {"TORCHELASTIC_RUN_ID", "x"}}));
  CHECK(info.source == RendezvousSource::kTorchrun);
  CHECK(info.rank == 5);
  CHECK(info.world_size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 4);
  CHECK(info.master_addr == "node7");
  CHECK(info.master_port == 29400);
  CHECK_FALSE(info.use_agent_store);
  CHECK(info.store_prefix.empty());
  CHECK_FALSE(info.is_store_server());
}

TEST_CASE("torchrun with the agent store: every rank is a client under the attempt prefix", "[env]") {
  auto info = rendezvous_from_env(fake({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"},
                                        {"MASTER_PORT", "1234"},
                                        {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                        {"TORCHELASTIC_RESTART_COUNT", "3"}}));
  CHECK(info.use_agent_store);
  CHECK(info.store_prefix == "/worker/attempt_3");
  CHECK_FALSE(info.is_store_server());  // rank 0 too: the agent hosts the store
  auto plain = rendezvous_from_env(fake({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"},
                                         {"MASTER_PORT", "1234"},
                                         {"TORCHELASTIC_USE_AGENT_STORE", "False"}}));
  CHECK(plain.is_store_server());
}

TEST_CASE("Slurm environment", "[env]") {
  auto info = rendezvous_from_env(fake({{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "16"},
                                        {"SLURM_LOCALID", "1"}, {"SLURM_TASKS_PER_NODE", "8(x2)"},
                                        {"SLURM_JOB_NODELIST", "gpu-a[012-015,020],login1"},
                                        {"SLURM_JOB_ID", "123456"}}));
  CHECK(info.source == RendezvousSource::kSlurm);
  CHECK(info.rank == 9);
  CHECK(info.world_size == 16);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 8);
  CHECK(info.master_addr == "gpu-a012");
  CHECK(info.master_port == 29500 + 456);
  CHECK(loom::launch::first_slurm_host("node1,node2") == "node1");
  CHECK(loom::launch::first_slurm_host("n[7-9]-ib") == "n7-ib");
  CHECK_THROWS_WITH(loom::launch::first_slurm_host("n[1-3"), Catch::Contains("unclosed"));
}

TEST_CASE("no launcher variables: one process", "[env]") {
  auto info = rendezvous_from_env(fake({}));
  CHECK(info.source == RendezvousSource::kSingleProcess);
  CHECK(info.world_size == 1);
  CHECK(info.is_store_server());
}

TEST_CASE("malformed launcher variables name the variable", "[env]") {
  CHECK_THROWS_WITH(rendezvous_from_env(fake({{"RANK", "8"}, {"WORLD_SIZE", "8"},
                                              {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})),
                    Catch::Contains("RANK=8") && Catch::Contains("out of range"));
  CHECK_THROWS_WITH(rendezvous_from_env(fake({{"RANK", "x"}, {"WORLD_SIZE", "8"},
                                              {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})),
                    Catch::Contains("RANK='x' is not an integer"));
  CHECK_THROWS_WITH(rendezvous_from_env(fake({{"RANK", "0"}, {"WORLD_SIZE", "2"},
                                              {"MASTER_PORT", "1"}})),
                    Catch::Contains("MASTER_ADDR"));
  CHECK_THROWS_WITH(rendezvous_from_env(fake({{"RANK", "0"}, {"WORLD_SIZE", "0"},
                                              {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})),
                    Catch::Contains("WORLD_SIZE=0"));
  CHECK_THROWS_WITH(rendezvous_from_env(fake({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}})),
                    Catch::Contains("SLURM_JOB_NODELIST"));
}
