"""Shared helpers of the `loom finetune` tests: a small deterministic instruction task in NeMo's
default SFT fields ({"input", "output"}), short enough for the tiny bases' 32 positions."""
import json

import torch

WORDS = "king lord love death heart night day blood crown sword".split()
# A plain chat template (no special tokens): "User: ...\nAssistant: ...\n" per turn.
CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}User: {{ m['content'] }}\n"
                 "{% elif m['role'] == 'system' %}{{ m['content'] }}\n"
                 "{% else %}Assistant: {{ m['content'] }}\n{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}Assistant:{% endif %}")


def word_records(n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        words = [WORDS[i] for i in torch.randperm(len(WORDS), generator=g)[:3].tolist()]
        first = bool(torch.randint(2, (1,), generator=g).item())
        out.append({"input": f"Words: {', '.join(words)}. The {'first' if first else 'last'} word is",
                    "output": words[0 if first else -1], "id": len(out)})  # "id": an extra key, ignored
    return out


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
