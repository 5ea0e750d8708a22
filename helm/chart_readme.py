#!/usr/bin/env python3
"""Generate the values table of a chart's README from its values.yaml (helm-docs conventions).

A key is documented by a `# -- description` comment directly above it (continuation lines are
plain `# ...` comments after it); each documented key is one row of the table (a map or a list
shows as JSON). Keys inside a documented map need no comment of their own (documented ones get a
row too); an undocumented key whose value is a non-empty map is a section whose children must be
documented; any other undocumented key is an error.

    python3 helm/chart_readme.py helm/specdec            # rewrite the table in README.md
    python3 helm/chart_readme.py helm/specdec --check    # exit 1 if README.md is out of date

The table sits between `<!-- values-table:start -->` and `<!-- values-table:end -->`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

START = "<!-- values-table:start -->"
END = "<!-- values-table:end -->"


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: Any
    description: str


class UndocumentedKeys(ValueError):
    """values.yaml has keys without a `# --` comment (and that are not sections)."""


def _comment_block(lines: list[str], line_index: int) -> list[str]:
    """Comment lines directly above line_index (no blank line in between), top to bottom."""
    block: list[str] = []
    i = line_index - 1
    while i >= 0 and lines[i].lstrip().startswith("#"):
        block.insert(0, lines[i].strip())
        i -= 1
    return block


def _description(block: list[str]) -> str | None:
    """The helm-docs description in a comment block: from the last `# --` line to the end."""
    starts = [i for i, line in enumerate(block) if line.startswith("# --")]
    if not starts:
        return None
    first, *rest = block[starts[-1]:]
    parts = [first[len("# --"):].strip()]
    parts += [line.lstrip("#").strip() for line in rest if not line.startswith("# @")]
    return " ".join(p for p in parts if p)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "null" if value is None else type(value).__name__


def values_rows(values_file: Path) -> list[Row]:
    """The documented keys of values_file in file order; raises UndocumentedKeys."""
    text = Path(values_file).read_text()
    lines = text.splitlines()
    data = yaml.safe_load(text) or {}
    root = yaml.compose(text)
    rows: list[Row] = []
    missing: list[str] = []

    def walk(node: yaml.MappingNode, prefix: str, values: dict[str, Any], covered: bool) -> None:
        for key_node, value_node in node.value:
            key = key_node.value
            path = f"{prefix}.{key}" if prefix else key
            description = _description(_comment_block(lines, key_node.start_mark.line))
            if description is not None:
                rows.append(Row(path, _type_name(values[key]), values[key], description))
            if isinstance(value_node, yaml.MappingNode) and value_node.value:
                walk(value_node, path, values[key], covered or description is not None)
            elif description is None and not covered:
                missing.append(path)

    if isinstance(root, yaml.MappingNode):
        walk(root, "", data, covered=False)
    if missing:
        raise UndocumentedKeys(f"{values_file}: keys without a '# --' comment: {', '.join(missing)}")
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(rows: list[Row]) -> str:
    out = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for row in rows:
        default = json.dumps(row.default, separators=(",", ":"), ensure_ascii=False)
        out.append(f"| `{row.key}` | {row.type} | `{_cell(default)}` | {_cell(row.description)} |")
    return "\n".join(out)


def readme_table(readme: Path) -> str:
    """The table currently between the markers of readme."""
    text = Path(readme).read_text()
    if START not in text or END not in text:
        raise ValueError(f"{readme}: missing {START} / {END} markers")
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def update_readme(chart_dir: Path) -> bool:
    """Rewrite the table in chart_dir/README.md; True when it changed."""
    readme = chart_dir / "README.md"
    text = readme.read_text()
    table = render_table(values_rows(chart_dir / "values.yaml"))
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n{table}\n{END}{tail}"
    if new != text:
        readme.write_text(new)
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chart_dir", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is out of date")
    args = parser.parse_args(argv)
    try:
        expected = render_table(values_rows(args.chart_dir / "values.yaml"))
        if args.check:
            if readme_table(args.chart_dir / "README.md") != expected:
                print(f"{args.chart_dir}/README.md is out of date: run helm/chart_readme.py {args.chart_dir}")
                return 1
            return 0
        print("updated" if update_readme(args.chart_dir) else "up to date")
    except (UndocumentedKeys, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
