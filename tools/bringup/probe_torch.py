"""Run by the python that has torch (not necessarily the driver's): torch, CUDA and GPU facts
for the environment step, one per line; ARCH=, GPU_NAME=, GPU_MEM_GIB= lines for the driver."""
import importlib.util

import torch

try:
    v = torch.cuda.nccl.version()
    nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as e:  # a CPU-only torch, or no NCCL in it
    nccl = f"- ({type(e).__name__})"
print(f"torch: {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, NCCL {nccl}")
for m in ("numpy", "packaging", "pytest"):
    print(f"python module {m}: {'present' if importlib.util.find_spec(m) else 'absent'}")
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"cuda:{i}: {p.name}, sm_{p.major}{p.minor}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
    p = torch.cuda.get_device_properties(0)
    print(f"ARCH={p.major}{p.minor}")
    print(f"GPU_NAME={p.name}")
    print(f"GPU_MEM_GIB={p.total_memory / 2**30:.1f}")
else:
    print("cuda: not available")
