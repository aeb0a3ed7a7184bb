"""Every tensor factory in csrc/ says where its tensor lives: it passes options or a device, or
it builds a host tensor on purpose and says so in a `host:` comment on its line or the line
before (issue "GPU-ready": a factory without options makes a CPU tensor, which on a GPU run is
the bug the stand-in device lane exists to catch)."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
FACTORY = re.compile(r"\bat::(zeros|ones|empty|full|arange|tensor|scalar_tensor|rand|randn|randint|"
                     r"from_blob|eye|linspace|empty_strided)\(")
PLACED = re.compile(r"\.options\(\)|device|options\b|\bopts\b|\bon_device\b")


def arguments_of(lines, i, start):
    """The argument list of the call whose name starts at lines[i][start] (it may span lines)."""
    text = "\n".join(lines[i:i + 8])[start:]
    open_at = text.index("(")
    depth = 0
    for k in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[k], 0)
        if depth == 0:
            return text[open_at:k + 1]
    return text[open_at:]


def unplaced_factories():
    found = []
    for path in sorted((ROOT / "csrc").rglob("*.cpp")) + sorted((ROOT / "csrc").rglob("*.h")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            for m in FACTORY.finditer(line):
                call = arguments_of(lines, i, m.start())
                comment = line + (lines[i - 1] if i else "")
                if PLACED.search(call) or "host:" in comment:
                    continue
                found.append(f"{path.relative_to(ROOT)}:{i + 1}: {line.strip()}")
    return found


def test_every_factory_names_its_device_or_says_host():
    found = unplaced_factories()
    assert not found, "tensor factories without options or a `host:` comment:\n" + "\n".join(found)


def test_the_check_finds_an_unplaced_factory(tmp_path, monkeypatch):
    # The rule must bite: a bare factory in a source file is reported.
    fake = tmp_path / "csrc" / "x.cpp"
    fake.parent.mkdir()
    fake.write_text("at::Tensor f() {\n  return at::zeros({3}, at::kLong);\n}\n"
                    "// host: a control flag\nat::Tensor g() { return at::ones({1}); }\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert unplaced_factories() == ["csrc/x.cpp:2: return at::zeros({3}, at::kLong);"]
