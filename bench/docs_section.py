"""Write one benchmark's section of docs/benchmarks.md, leaving the others alone."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = ("# Benchmarks\n\nMeasured results of the benchmarks in `bench/`. Each section "
          "is (re)written by the benchmark named in it.\n")


def write_section(heading: str, text: str, path: Path = DOC) -> None:
    """Replace the section that starts with the line `heading` (up to the next `## `),
    or append it; `text` is the whole section, heading included."""
    old = path.read_text() if path.exists() else HEADER
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
    if pattern.search(old):
        new = pattern.sub(lambda _m: text.rstrip("\n") + "\n\n", old, count=1)
    else:
        new = old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new.rstrip("\n") + "\n")


def cpu_name(default: str | None = None) -> str:
    """The CPU's model name (/proc/cpuinfo), else `default` (platform.processor() or the
    architecture when None), for the machine line of a benchmark section."""
    cpu = platform.processor() or (platform.machine() if default is None else default)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return cpu


def machine() -> str:
    """"<cpu>, <n> cores, Python <version>"."""
    return f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}"
