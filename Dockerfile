# Loom for GPU hosts (DGX A100/H100/H200, Azure NDv4/NDv5): Debian 12, the CUDA 13.0 toolkit
# (nvcc for the op library's kernels), the pinned torch wheel (LibTorch, CUDA runtime, NCCL) and
# the Debian libraries of tools/setup.sh. The host supplies the driver (NVIDIA Container Toolkit).
#   docker build -t loom:latest .
#   docker run --gpus all --ipc=host --network=host --ulimit memlock=-1 -v /data:/data loom:latest \
#       loom train recipes/gpt3_126m.yaml model.data.data_prefix=[1.0,/data/pile_text_document]
# On Slurm with pyxis/enroot set cluster.container_image and let `loom slurm` write the job.
# Multi-node NCCL over InfiniBand needs the host's RDMA stack inside the container (add the
# MOFED/rdma-core user-space matching the hosts, e.g. Azure's HPC images).
# Base: Debian 12 (default) or, for DGX/Azure users who already pull it, NVIDIA's NGC PyTorch
# image, which brings the CUDA toolkit (so no toolkit is installed on top of it):
#   docker build --build-arg BASE_IMAGE=nvcr.io/nvidia/pytorch:YY.MM-py3 --build-arg CUDA_TOOLKIT= -t loom:ngc .
# NGC's own torch is not used: tools/setup.sh installs the pinned wheel into .venv (LibTorch comes
# from it), so both bases build the same Loom. NGC images are Ubuntu; setup.sh's package names
# are Debian 12's, which Ubuntu 24.04 also has (not checked by building: see below).
# This image has never been built: the development machine and CI have no Docker engine. CI
# lints this file with hadolint (tests/python/test_dockerfile.py).
ARG BASE_IMAGE=debian:12
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive
# The toolkit's version is pinned by its package name; empty when the base already has nvcc.
ARG CUDA_TOOLKIT=cuda-toolkit-13-0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# DL3008 (pin apt versions): ca-certificates, wget and python3 are taken at the Debian 12 point
# release's current version on purpose (security updates); the CUDA toolkit is pinned by name.
# hadolint ignore=DL3008
RUN if [ -n "${CUDA_TOOLKIT}" ]; then \
      apt-get update -qq \
      && apt-get install -y -qq --no-install-recommends ca-certificates wget python3 \
      && wget -q https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
      && dpkg -i cuda-keyring_1.1-1_all.deb && rm cuda-keyring_1.1-1_all.deb \
      && apt-get update -qq \
      && apt-get install -y -qq --no-install-recommends "${CUDA_TOOLKIT}" \
      && rm -rf /var/lib/apt/lists/*; \
    fi
ENV PATH=/usr/local/cuda/bin:${PATH}

WORKDIR /opt/loom
COPY . .
# tools/setup.sh installs the Debian packages of its APT_PACKAGES (compilers, yaml-cpp, fmt,
# protobuf and protoc for the TensorBoard writer, iproute2, ...) and .venv (torch, pinned); the
# build skips tests.
ARG BUILD_JOBS=8
RUN bash tools/setup.sh \
 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_BUILD_TESTS=OFF -DLOOM_WITH_CUDA=ON \
 && cmake --build build -j "${BUILD_JOBS}" \
 && rm -rf /var/lib/apt/lists/* /root/.cache
ENV PATH=/opt/loom/build/bin:${PATH}
CMD ["loom", "--help"]
