# Loom for GPU hosts (DGX A100/H100/H200, Azure NDv4/NDv5): Debian 12, the CUDA 13.0 toolkit
# (nvcc for the op library's kernels), the pinned torch wheel (LibTorch, CUDA runtime, NCCL) and
# the Debian libraries of tools/setup.sh. The host supplies the driver (NVIDIA Container Toolkit).
#   docker build -t loom:latest .
#   docker run --gpus all --ipc=host --network=host --ulimit memlock=-1 -v /data:/data loom:latest \
#       loom train recipes/gpt3_126m.yaml model.data.data_prefix=[1.0,/data/pile_text_document]
# On Slurm with pyxis/enroot set cluster.container_image and let `loom slurm` write the job.
# Multi-node NCCL over InfiniBand needs the host's RDMA stack inside the container (add the
# MOFED/rdma-core user-space matching the hosts, e.g. Azure's HPC images).
# Not built by CI: the development machine has no Docker engine.
FROM debian:12

ENV DEBIAN_FRONTEND=noninteractive
ARG CUDA_TOOLKIT=cuda-toolkit-13-0
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends ca-certificates wget python3 \
 && wget -q https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
 && dpkg -i cuda-keyring_1.1-1_all.deb && rm cuda-keyring_1.1-1_all.deb \
 && apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends ${CUDA_TOOLKIT} \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:${PATH}

WORKDIR /opt/loom
COPY . .
# tools/setup.sh installs the Debian packages and .venv (torch, pinned); the build skips tests.
ARG BUILD_JOBS=8
RUN bash tools/setup.sh \
 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_BUILD_TESTS=OFF -DLOOM_WITH_CUDA=ON \
 && cmake --build build -j ${BUILD_JOBS} \
 && rm -rf /var/lib/apt/lists/* /root/.cache
ENV PATH=/opt/loom/build/bin:${PATH}
CMD ["loom", "--help"]
