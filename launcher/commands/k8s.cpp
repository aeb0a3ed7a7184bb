// `loom k8s RECIPE [overrides] [--output FILE]`: writes the Kubeflow PyTorchJob that trains the
// recipe on Kubernetes (csrc/config/k8s_job.h). The recipe is validated first, so a job is never
// written for a recipe `loom train` would refuse.
#include <CLI/CLI.hpp>

#include <iostream>

#include "command_registry.h"
#include "config/k8s_job.h"
#include "config/recipe.h"
#include "job_file_output.h"

namespace {

int k8s_command(int argc, char** argv) {
  CLI::App app{"Write a Kubeflow PyTorchJob (kubectl apply -f) that trains a recipe: a master and "
               "trainer.num_nodes - 1 worker pods, each running trainer.devices ranks through torchrun."};
  app.name(argc > 0 ? argv[0] : "loom k8s");
  std::string recipe_path, output = "-";
  std::vector<std::string> overrides;
  loom::config::K8sJobOptions options;
  app.add_option("recipe", recipe_path, "recipe file, e.g. recipes/gpt3_126m.yaml")->required();
  app.add_option("overrides", overrides, "dotted overrides, e.g. trainer.num_nodes=4");
  app.add_option("--output", output, "YAML file to write ('-' = stdout)")->capture_default_str();
  app.add_option("--image", options.image, "container image (default: cluster.container_image)");
  app.add_option("--namespace", options.namespace_name, "Kubernetes namespace of the job");
  app.add_option("--loom", options.loom_command, "how the container runs Loom")->capture_default_str();
  app.add_option("--torchrun", options.torchrun, "the image's torchrun")->capture_default_str();
  app.add_option("--interface", options.network_interface, "the pods' network interface (GLOO_SOCKET_IFNAME)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  loom::config::Recipe recipe;
  std::string job;
  try {
    recipe = loom::config::load_recipe(recipe_path, overrides);
  } catch (const std::exception& e) {
    std::cerr << "loom k8s: invalid recipe:\n" << e.what() << "\n";
    return 2;
  }
  try {
    job = loom::config::k8s_pytorchjob(recipe, recipe_path, overrides, options);
  } catch (const std::invalid_argument& e) {
    std::cerr << "loom k8s: " << e.what() << "\n";
    return 2;
  }
  return loom::cli::write_job_file("loom k8s", output, job, "kubectl apply -f");
}

}  // namespace

LOOM_REGISTER_COMMAND("k8s", "write the Kubeflow PyTorchJob that trains a recipe on Kubernetes", k8s_command);
