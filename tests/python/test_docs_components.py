"""docs/architecture.md's component table matches the targets CMake defines (issue 28, "prose that
cannot drift"). Plain text parsing of the CMakeLists.txt files; nothing is configured or built.

What is compared:
- Every library target (add_library, ALIAS and IMPORTED ones excepted; OBJECT libraries
  included) and every executable defined by a CMakeLists.txt under csrc/, extensions/ and
  launcher/ -- Loom's components and the `loom` executable -- is named in the table's target
  column exactly once, in a row whose folder lies inside the folder of the CMakeLists.txt that
  defines it, and that row's "torch?" cell says whether the target links torch (loom_torch or
  loom_use_torch_pch, directly or through another of these targets).
- The table names no target that CMake does not define. Rows under tests/ (test binaries, the
  CUDA simulator, the stand-in device) are checked only this way: their targets are test
  scaffolding, not components, and per-component test binaries are made by a loop in
  tests/CMakeLists.txt, so the table names them by the pattern `loom_test_<component>` (a name
  with `<...>` is a placeholder and is not looked up). tools/ and third_party/ are not compared.
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
COMPONENT_DIRS = ("csrc", "extensions", "launcher")
DEFINING_DIRS = COMPONENT_DIRS + ("tests", "tools")
DEFINE = re.compile(r"\badd_(library|executable)\s*\(\s*([^\s)]+)([^)]*)\)", re.IGNORECASE)
LINK = re.compile(r"\btarget_link_libraries\s*\(\s*([^\s)]+)([^)]*)\)", re.IGNORECASE)
TORCH_PCH = re.compile(r"\bloom_use_torch_pch\s*\(\s*([^\s)]+)\s*\)", re.IGNORECASE)


def cmake_text(path):
    """The file without its comments (`#` to the end of the line, outside quoted arguments)."""
    out = []
    for line in path.read_text().splitlines():
        quoted = False
        for i, ch in enumerate(line):
            if ch == '"':
                quoted = not quoted
            elif ch == "#" and not quoted:
                line = line[:i]
                break
        out.append(line)
    return "\n".join(out)


def cmake_files(top):
    return sorted(p for p in (ROOT / top).rglob("CMakeLists.txt") if "third_party" not in p.parts)


def defined_targets(tops):
    """{name: (kind, folder of its CMakeLists.txt relative to the root)} for `tops`."""
    targets = {}
    for top in tops:
        for path in cmake_files(top):
            for kind, name, rest in DEFINE.findall(cmake_text(path)):
                if re.search(r"\b(ALIAS|IMPORTED)\b", rest):
                    continue
                targets[name] = (kind.lower(), path.parent.relative_to(ROOT).as_posix() + "/")
    return targets


def torch_targets(names):
    """The subset of `names` (targets of the component folders) that use torch."""
    links, torch = {}, set()
    for top in COMPONENT_DIRS:
        for path in cmake_files(top):
            text = cmake_text(path)
            for name, args in LINK.findall(text):
                links.setdefault(name, set()).update(re.findall(r"[\w:$-]+", args))
            torch.update(n for n in TORCH_PCH.findall(text))
    torch.update(n for n, deps in links.items() if "loom_torch" in deps)
    changed = True
    while changed:
        changed = False
        for name, deps in links.items():
            if name not in torch and deps & torch:
                torch.add(name)
                changed = True
    return torch & set(names)


def component_table():
    """[(line number, folder, [target names], torch cell)] of the table headed `| folder | target |`."""
    lines = DOC.read_text().splitlines()
    for start, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:2] == ["folder", "target"]:
            break
    else:
        raise AssertionError(f"{DOC}: no table headed '| folder | target | ...' found")
    torch_col = cells.index("torch?")
    rows = []
    for number in range(start + 2, len(lines)):
        line = lines[number].strip()
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        folder = cells[0].strip("`")
        rows.append((number + 1, folder, re.findall(r"`([^`]+)`", cells[1]), cells[torch_col]))
    return rows


def test_component_table_matches_cmake_targets():
    components = defined_targets(COMPONENT_DIRS)
    everything = defined_targets(DEFINING_DIRS)
    assert {"loom_launch", "loom_ops", "loom"} <= components.keys(), \
        f"the CMake parser found too little under {COMPONENT_DIRS}: {sorted(components)}"
    rows = component_table()
    listed = {}
    for number, folder, names, _ in rows:
        for name in names:
            listed.setdefault(name, []).append((number, folder))

    problems = []
    missing = sorted(components.keys() - listed.keys())
    if missing:
        problems.append("targets CMake defines that the table does not list: " + ", ".join(
            f"{n} ({components[n][1]}CMakeLists.txt)" for n in missing))
    twice = sorted(n for n, where in listed.items() if len(where) > 1)
    if twice:
        problems.append("targets listed more than once: " + ", ".join(
            f"{n} (lines {', '.join(str(w[0]) for w in listed[n])})" for n in twice))
    extra = sorted(n for n in listed if "<" not in n and n not in everything)
    if extra:
        problems.append("targets the table lists that no CMakeLists.txt defines: " + ", ".join(
            f"{n} (line {listed[n][0][0]})" for n in extra))
    for name, (_, cmake_dir) in sorted(components.items()):
        for number, folder in listed.get(name, []):
            if not folder.startswith(cmake_dir):
                problems.append(f"line {number}: {name} is in folder `{folder}`, but "
                                f"{cmake_dir}CMakeLists.txt defines it")
    with_torch = torch_targets(components)
    for number, folder, names, torch_cell in rows:
        for name in names:
            if name not in components:
                continue
            expected = "yes" if name in with_torch else "no"
            if torch_cell != expected:
                problems.append(f"line {number}: {name}'s torch? cell says '{torch_cell}', "
                                f"CMake says '{expected}'")
    assert not problems, f"{DOC.relative_to(ROOT)} component table vs CMake:\n  " + \
        "\n  ".join(problems)
