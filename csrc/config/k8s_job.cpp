#include "config/k8s_job.h"

#include <fmt/format.h>

#include <cctype>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "config/slurm_script.h"

namespace loom::config {
namespace {

// A YAML double-quoted scalar (JSON's string syntax is valid YAML).
std::string q(const std::string& s) { return nlohmann::json(s).dump(); }

struct Mount {
  std::string source, target;
};

std::vector<Mount> parse_mounts(const std::vector<std::string>& mounts) {
  std::vector<Mount> out;
  for (const auto& m : mounts) {
    const auto colon = m.find(':');
    if (colon == std::string::npos) out.push_back({m, m});
    else out.push_back({m.substr(0, colon), m.substr(colon + 1, m.find(':', colon + 1) - colon - 1)});
  }
  return out;
}

// One replica type's entry under pytorchReplicaSpecs (indented for it).
std::string replica(const std::string& type, int64_t replicas, const Recipe& r, const std::string& image,
                    const std::string& command, const K8sJobOptions& o, const std::vector<Mount>& mounts) {
  std::string s;
  s += fmt::format("    {}:\n", type);
  s += fmt::format("      replicas: {}\n", replicas);
  s += "      restartPolicy: OnFailure\n";
  s += "      template:\n";
  s += "        spec:\n";
  s += "          containers:\n";
  s += "            - name: pytorch\n";
  s += fmt::format("              image: {}\n", q(image));
  s += "              command: [\"bash\", \"-c\"]\n";
  s += fmt::format("              args:\n                - {}\n", q(command));
  s += "              env:\n";
  s += fmt::format("                - name: GLOO_SOCKET_IFNAME\n                  value: {}\n", q(o.network_interface));
  if (r.trainer.accelerator == Accelerator::kGpu) {
    s += "              resources:\n";
    s += fmt::format("                limits:\n                  nvidia.com/gpu: {}\n", r.trainer.devices);
  }
  s += "              volumeMounts:\n";
  s += "                - name: dshm\n                  mountPath: /dev/shm\n";
  for (size_t i = 0; i < mounts.size(); ++i)
    s += fmt::format("                - name: mount-{}\n                  mountPath: {}\n", i, q(mounts[i].target));
  s += "          volumes:\n";
  s += "            - name: dshm\n              emptyDir:\n                medium: Memory\n";
  for (size_t i = 0; i < mounts.size(); ++i)
    s += fmt::format("            - name: mount-{}\n              hostPath:\n                path: {}\n", i,
                     q(mounts[i].source));
  return s;
}

}  // namespace

std::string k8s_name(const std::string& text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u)) out += static_cast<char>(std::tolower(u));
    else if (!out.empty() && out.back() != '-') out += '-';
  }
  if (out.size() > 63) out.resize(63);
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "loom" : out;
}

std::string k8s_pytorchjob(const Recipe& r, const std::string& recipe_path, const std::vector<std::string>& overrides,
                           const K8sJobOptions& o) {
  const std::string image = !o.image.empty() ? o.image : r.cluster.container_image.value_or("");
  if (image.empty())
    throw std::invalid_argument("no container image: set cluster.container_image or pass --image");
  std::string command = fmt::format(
      "exec {} --nnodes {} --nproc-per-node {} --node-rank \"$RANK\" --master-addr \"$MASTER_ADDR\" "
      "--master-port \"$MASTER_PORT\" --no-python {} train {}",
      shell_quote(o.torchrun), r.trainer.num_nodes, r.trainer.devices, o.loom_command, shell_quote(recipe_path));
  for (const auto& ov : overrides) command += " " + shell_quote(ov);
  const auto mounts = parse_mounts(r.cluster.container_mounts);

  std::string s;
  s += fmt::format("# Written by `loom k8s` for {}; submit with `kubectl apply -f <this file>`.\n", recipe_path);
  s += "apiVersion: kubeflow.org/v1\n";
  s += "kind: PyTorchJob\n";
  s += "metadata:\n";
  s += fmt::format("  name: {}\n", k8s_name(r.cluster.job_name_prefix + r.run.name));
  if (!o.namespace_name.empty()) s += fmt::format("  namespace: {}\n", q(o.namespace_name));
  s += "spec:\n";
  s += "  runPolicy:\n    cleanPodPolicy: None\n";
  s += "  pytorchReplicaSpecs:\n";
  s += replica("Master", 1, r, image, command, o, mounts);
  if (r.trainer.num_nodes > 1) s += replica("Worker", r.trainer.num_nodes - 1, r, image, command, o, mounts);
  return s;
}

}  // namespace loom::config
