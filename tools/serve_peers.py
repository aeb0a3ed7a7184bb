"""The peers of tools/bench_serve.py, on the same weights: a random GPT-2 of a chosen shape written
by transformers (with GPT-2's tokenizer files), imported into Loom with `loom convert --from hf`,
converted to GGUF by llama.cpp's own converter for its server, and loaded by transformers.

llama.cpp comes from the `llama-cpp-python` sdist, which vendors its whole source
(docs/serving.md, "Beside the peers" says how to build `llama-server` from it)."""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import requests

ROOT = pathlib.Path(__file__).resolve().parents[1]

# name -> (layers, hidden, heads); 1024 positions, GPT-2's vocabulary.
SHAPES = {"tiny": (4, 128, 4), "gpt2-small": (12, 768, 12)}
POSITIONS = 1024


def make_weights(out, shape, seed=0):
    """A GPT2LMHeadModel of SHAPES[shape] with seeded random weights, saved with the tokenizer files
    both Loom's import (vocab.json, merges.txt) and llama.cpp's converter (tokenizer.json) read."""
    import torch
    import transformers
    layers, hidden, heads = SHAPES[shape]
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=POSITIONS)
    transformers.GPT2LMHeadModel(config).save_pretrained(out)
    # GPT-2's released config.json has n_ctx beside n_positions (llama.cpp's converter reads it);
    # transformers 5 no longer writes it.
    config_file = out / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "n_ctx": POSITIONS}, indent=2))
    shutil.copy(ROOT / "data" / "gpt2-vocab.json", out / "vocab.json")
    shutil.copy(ROOT / "data" / "gpt2-merges.txt", out / "merges.txt")
    # tokenizer.json from those files (transformers 5's GPT2TokenizerFast(vocab_file=...) builds
    # an empty vocabulary; from_pretrained of the folder reads them).
    transformers.GPT2TokenizerFast.from_pretrained(out, local_files_only=True).save_pretrained(out)
    return out


def import_into_loom(hf_dir, run):
    from test_data_helpers import loom_binary
    done = subprocess.run([str(loom_binary()), "convert", "--from", "hf", str(hf_dir), "--output", str(run)], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError("loom convert --from hf failed:\n" + done.stderr[-4000:])
    return run


def to_gguf(hf_dir, llama_cpp, out):
    """llama.cpp's convert_hf_to_gguf.py (with its own gguf-py) at fp32, the precision Loom serves
    in on CPUs."""
    env = dict(os.environ, PYTHONPATH=str(llama_cpp / "gguf-py"))
    done = subprocess.run([sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(hf_dir), "--outtype", "f32",
                           "--outfile", str(out)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError("convert_hf_to_gguf.py failed:\n" + done.stderr[-4000:])
    return out


class LlamaServer:
    """llama.cpp's `llama-server` with `slots` parallel sequences (continuous batching), each with
    the model's whole context, on `threads` threads; `url` once /health answers."""

    def __init__(self, binary, gguf, slots, threads, port, log_dir, extra=(), timeout=180):
        cmd = [str(binary), "-m", str(gguf), "-np", str(slots), "-c", str(slots * POSITIONS), "-t", str(threads),
               "-tb", str(threads), "--port", str(port), "--host", "127.0.0.1", "--no-webui", *extra]
        # Its log goes to a file: it writes a line per request, and an undrained pipe would fill
        # and stop it.
        self.log_path = pathlib.Path(log_dir) / f"llama-server-{port}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("llama-server exited:\n" + self.log_path.read_text()[-4000:])
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("llama-server did not become healthy")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def load_transformers(hf_dir, threads):
    import torch
    import transformers
    torch.set_num_threads(threads)
    return transformers.GPT2LMHeadModel.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
