// Kubernetes jobs for a recipe (`loom k8s`): a Kubeflow training-operator PyTorchJob
// (kubeflow.org/v1; the CRD is tests/data/k8s/kubeflow.org_pytorchjobs.yaml) with one Master
// pod and trainer.num_nodes - 1 Worker pods. Each pod runs torchrun, which starts
// trainer.devices ranks of `loom train` and hands them the environment Loom's torchrun
// rendezvous reads (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT:
// launch/env_rendezvous.h); the operator gives each pod RANK (its node rank), MASTER_ADDR (the
// master pod's service) and MASTER_PORT. docs/clusters.md describes the fields.
#pragma once
#include <string>
#include <vector>

#include "config/recipe.h"

namespace loom::config {

struct K8sJobOptions {
  std::string image;                              ///< --image, else cluster.container_image
  std::string namespace_name;                     ///< --namespace ("" = none written)
  std::string loom_command = "loom";              ///< how the container runs Loom
  std::string torchrun = "/opt/loom/.venv/bin/torchrun";  ///< the image's torchrun (Dockerfile)
  std::string network_interface = "eth0";         ///< the pod's interface, for Gloo (GLOO_SOCKET_IFNAME)
};

/// A DNS-1123 name from `text`: lower case, runs of other characters as '-', at most 63
/// characters, trimmed of '-' at both ends; "loom" if nothing is left.
std::string k8s_name(const std::string& text);

/// The PyTorchJob YAML: metadata.name = k8s_name(job_name_prefix + run.name); per replica type
/// restartPolicy OnFailure (a restarted pod resumes from the run's checkpoint), one container
/// named "pytorch" (the operator's rule) running
/// `<torchrun> --nnodes N --nproc-per-node D --node-rank $RANK --master-addr $MASTER_ADDR
/// --master-port $MASTER_PORT --no-python <loom> train <recipe> <overrides...>` under bash;
/// resources nvidia.com/gpu = trainer.devices for GPU recipes; a memory-backed /dev/shm
/// emptyDir; cluster.container_mounts "SRC:DST" as hostPath volumes; GLOO_SOCKET_IFNAME.
/// Throws std::invalid_argument when there is no image (neither option nor
/// cluster.container_image).
std::string k8s_pytorchjob(const Recipe& recipe, const std::string& recipe_path,
                           const std::vector<std::string>& overrides, const K8sJobOptions& options);

}  // namespace loom::config
