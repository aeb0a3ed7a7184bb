"""`loom k8s` PyTorchJobs against the Kubeflow training operator's CRD: the golden job
(tests/data/k8s/pytorchjob_golden.yaml, which tests/config/test_k8s_job.cpp proves is exactly
what the generator writes) and a CPU job from the real command validate against the CRD's
openAPIV3Schema with jsonschema; a broken job does not; the command renders the golden bytes."""
import subprocess

import pytest
import yaml

from test_data_helpers import ROOT, loom_binary

jsonschema = pytest.importorskip("jsonschema")

DATA = ROOT / "tests" / "data" / "k8s"
GOLDEN_OVERRIDES = [  # the inputs of the golden file (kGoldenOverrides in the C++ test)
    "trainer.accelerator=gpu", "trainer.precision=bf16", "trainer.num_nodes=2", "trainer.devices=8",
    "run.name=gpt_126m", "cluster.container_image=registry.example/loom:1.0",
    "cluster.container_mounts=[/lustre/data:/data,/lustre/runs:/runs]", "exp_manager.explicit_log_dir=/runs/gpt 126m"]


@pytest.fixture(scope="module")
def schema():
    crd = yaml.safe_load((DATA / "kubeflow.org_pytorchjobs.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


def validate(job, schema):
    jsonschema.Draft7Validator(schema).validate(job)


def test_the_golden_job_is_a_valid_pytorchjob(schema):
    job = yaml.safe_load((DATA / "pytorchjob_golden.yaml").read_text())
    validate(job, schema)
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 1  # 2 nodes
    for spec in specs.values():
        pod = spec["template"]["spec"]
        container = pod["containers"][0]
        assert container["name"] == "pytorch"  # the operator finds its container by this name
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert "--nnodes 2 --nproc-per-node 8 --node-rank \"$RANK\"" in container["args"][0]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]


def test_a_broken_job_fails_the_schema(schema):
    job = yaml.safe_load((DATA / "pytorchjob_golden.yaml").read_text())
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        validate(job, schema)
    job = yaml.safe_load((DATA / "pytorchjob_golden.yaml").read_text())
    del job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(jsonschema.ValidationError):
        validate(job, schema)


def loom_k8s(*args, check=True):
    done = subprocess.run([str(loom_binary()), "k8s", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def test_the_command_renders_the_golden_file_and_valid_cpu_jobs(schema, tmp_path):
    out = tmp_path / "job.yaml"
    done = loom_k8s("tests/data/k8s/minimal_recipe.yaml", *GOLDEN_OVERRIDES, "--namespace", "llm",
                    "--output", str(out))
    assert "kubectl apply -f" in done.stderr
    assert out.read_bytes() == (DATA / "pytorchjob_golden.yaml").read_bytes()
    cpu = loom_k8s("recipes/gpt3_tiny_cpu.yaml", "trainer.num_nodes=2", "--image", "loom:cpu").stdout
    job = yaml.safe_load(cpu)
    validate(job, schema)
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    assert "nvidia.com/gpu" not in cpu


def test_bad_input_exits_2(tmp_path):
    done = loom_k8s("recipes/gpt3_tiny_cpu.yaml", check=False)
    assert done.returncode == 2 and "cluster.container_image" in done.stderr
    done = loom_k8s("recipes/gpt3_tiny_cpu.yaml", "trainer.num_nodes=0", "--image", "x", check=False)
    assert done.returncode == 2 and "trainer.num_nodes" in done.stderr
