#!/usr/bin/env python3
"""Writes the field table of recipes/README.md from the recipe schema, so that each default is
stated once: in csrc/config/recipe.h's initialisers, which `loom recipe-fields` reads through the
schema (csrc/config/schema.h, csrc/config/recipe_fields.h).

    .venv/bin/python tools/recipe_fields_table.py [--loom build/bin/loom]           # rewrite
    .venv/bin/python tools/recipe_fields_table.py --check                           # compare

The table lies between the lines `<!-- recipe-fields begin -->` and `<!-- recipe-fields end -->`.
Its columns field, recipe (empty: every kind; else the kinds that have it: `train` for `loom
train` recipes, `ptune` for `loom ptune`'s, `finetune` for `loom finetune`'s), need (R / D / =)
and default are generated; the last column, the
rule, is prose kept from the README by field (a field new to the schema gets an empty rule; the
rule of a field the schema no longer has is dropped, and named on stderr). --check writes
nothing and exits 1 with a diff when the README's table is not what would be written
(tests/python/test_recipe_fields_table.py runs it).
"""
import argparse
import difflib
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "recipes" / "README.md"
BEGIN = "<!-- recipe-fields begin -->"
END = "<!-- recipe-fields end -->"
HEADER = ["| field | recipe | | default | rule |", "|---|---|---|---|---|"]
NEED = {"required": "R", "default": "D", "derived": "="}
KIND_LABEL = {"pretraining": "train", "prompt_learning": "ptune", "finetuning": "finetune"}


def schema_fields(loom):
    """`loom recipe-fields` as a dict: kind -> list of fields."""
    done = subprocess.run([str(loom), "recipe-fields"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{loom} recipe-fields failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout)


def split_row(line):
    """The cells of a Markdown table row; `\\|` stays inside a cell."""
    body = line.strip()
    assert body.startswith("|") and body.endswith("|"), f"not a table row: {line!r}"
    cells, cur, i = [], "", 1
    while i < len(body) - 1:
        if body[i] == "\\" and body[i + 1] == "|":
            cur += "\\|"
            i += 2
            continue
        if body[i] == "|":
            cells.append(cur.strip())
            cur = ""
        else:
            cur += body[i]
        i += 1
    cells.append(cur.strip())
    return cells


def find_table(text):
    """(lines before, table lines, lines after) of the README text, split at the markers."""
    lines = text.split("\n")
    try:
        begin = lines.index(BEGIN)
        end = lines.index(END)
    except ValueError:
        raise SystemExit(f"the README has no '{BEGIN}' ... '{END}' section") from None
    if end < begin:
        raise SystemExit(f"'{END}' comes before '{BEGIN}'")
    return lines[: begin + 1], lines[begin + 1 : end], lines[end:]


def rules_of(table_lines):
    """field -> rule (the last cell) of the README's current table."""
    rules = {}
    for line in table_lines[len(HEADER) :]:
        if not line.strip():
            continue
        cells = split_row(line)
        rules[cells[0].strip("`")] = cells[-1]
    return rules


def merged_fields(schema):
    """Every field of any kind once, each with {kind: field}: the pretraining fields in their
    dump order, then each further kind merged in turn, each run of fields new to the table just
    before the next field already in it (so after the fields that precede it), or at the end."""
    order = [f["field"] for f in schema["pretraining"]]
    by_path = {f["field"]: {"pretraining": f} for f in schema["pretraining"]}
    for kind in KIND_LABEL:
        if kind == "pretraining" or kind not in schema:
            continue
        pending = []
        for f in schema[kind]:
            path = f["field"]
            if path in by_path:
                at = order.index(path)
                order[at:at] = pending
                pending = []
                by_path[path][kind] = f
            else:
                pending.append(path)
                by_path[path] = {kind: f}
        order += pending
    return [(path, by_path[path]) for path in order]


def escape(text):
    return text.replace("|", "\\|")


def default_cell(f):
    """The default (for D fields) and the names an enum field accepts ("=" joins spellings)."""
    parts = []
    if f["need"] == "default":
        parts.append(f"`{escape(f['default'])}`")
    if f["choices"]:
        names = ", ".join(" = ".join(f"`{escape(n)}`" for n in spellings) for spellings in f["choices"])
        parts.append(f"({names})" if parts else f"one of {names}")
    return " ".join(parts)


def row_of(path, kinds, rule, all_kinds=len(KIND_LABEL)):
    """One table row. A field whose requirement or default differs between kinds shows each
    kind's, labelled."""
    present = [k for k in KIND_LABEL if k in kinds]
    recipe = "" if len(present) == all_kinds else ", ".join(KIND_LABEL[k] for k in present)
    per_kind = {kind: (NEED[f["need"]], default_cell(f)) for kind, f in kinds.items()}
    values = set(per_kind.values())
    if len(values) == 1:
        need, default = values.pop()
    else:
        need = ", ".join(f"{per_kind[k][0]} ({KIND_LABEL[k]})" for k in present)
        default = ", ".join(f"{per_kind[k][1]} ({KIND_LABEL[k]})" for k in present if per_kind[k][1])
    cells = [path, recipe, need, default, rule]
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"


def render(schema, rules):
    """The table lines for `schema` with the rules kept by field."""
    kinds_in_schema = sum(kind in schema for kind in KIND_LABEL)
    return HEADER + [row_of(path, kinds, rules.get(path, ""), kinds_in_schema) for path, kinds in merged_fields(schema)]


def regenerate(text, schema):
    """(new README text, fields whose rule was dropped)."""
    before, table, after = find_table(text)
    rules = rules_of(table)
    new_table = render(schema, rules)
    known = {path for path, _ in merged_fields(schema)}
    dropped = sorted(set(rules) - known)
    return "\n".join(before + new_table + after), dropped


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loom", default=str(ROOT / "build" / "bin" / "loom"), help="the loom executable")
    parser.add_argument("--readme", default=str(README), help="the README holding the table")
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 with a diff when they differ")
    args = parser.parse_args(argv)
    readme = pathlib.Path(args.readme)
    text = readme.read_text()
    new_text, dropped = regenerate(text, schema_fields(args.loom))
    for path in dropped:
        print(f"recipe_fields_table: the schema has no field {path}; its rule is dropped", file=sys.stderr)
    if args.check:
        if new_text != text:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new_text.splitlines(True),
                                                       str(readme), "generated from loom recipe-fields"))
            print(f"\n{readme}: the field table differs from the schema; run tools/recipe_fields_table.py",
                  file=sys.stderr)
            return 1
        return 0
    if new_text != text:
        readme.write_text(new_text)
        print(f"recipe_fields_table: rewrote the table of {readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
