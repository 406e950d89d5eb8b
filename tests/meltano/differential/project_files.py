"""Writing a shape's files: meltano.yml and included files from a model, in
YAML's block style (as people write them), and everything else as text."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List

# A scalar YAML reads back as the same string when written bare.
_BARE = re.compile(r"^[A-Za-z_/.][A-Za-z0-9_./-]*$")
_YAML_WORDS = {"null", "true", "false", "yes", "no", "on", "off", "y", "n", "~"}


def scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if value is None:
        return "null"
    text = str(value)
    if _BARE.match(text) and text.lower() not in _YAML_WORDS:
        return text
    # A JSON string is a YAML double-quoted scalar with the same value.
    return json.dumps(text)


def yaml_lines(value: Any, indent: str = "") -> List[str]:
    lines: List[str] = []
    if isinstance(value, dict):
        if not value:
            return [indent + "{}"]
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{indent}{key}:")
                lines.extend(yaml_lines(item, indent + "  "))
            elif isinstance(item, (dict, list)):
                lines.append(f"{indent}{key}: {'{}' if isinstance(item, dict) else '[]'}")
            else:
                lines.append(f"{indent}{key}: {scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)) and item:
                inner = yaml_lines(item, indent + "  ")
                lines.append(f"{indent}- {inner[0].lstrip()}")
                lines.extend(inner[1:])
            else:
                lines.append(f"{indent}- {scalar(item)}")
    else:
        lines.append(indent + scalar(value))
    return lines


def to_yaml(model: Dict[str, Any]) -> str:
    return "\n".join(yaml_lines(model)) + "\n"


def write(root: Path, files: Dict[str, str]) -> None:
    """Writes ``files`` (path under ``root`` → text) under ``root``."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        # newline="": a .env written with CRLF keeps them.
        with open(path, "w", encoding="utf-8", newline="") as file:
            file.write(text)


def substitute(text: str, shape_dir: Path) -> str:
    """A shape names its own directory ``{dir}`` in arguments and variables."""
    return text.replace("{dir}", str(shape_dir))
