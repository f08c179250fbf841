"""Top costs from a py-spy profile in collapsed-stack form (`py-spy record --format raw`).

    python -m benchlib.profile FILE [--top 20]

Each line of the file is `frame;frame;...;frame COUNT`, outermost first, a
frame being `function (file:line)`. Self time is the innermost frame's;
inclusive time counts a function once per stack it appears in.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r":\d+\)$")


def _function(frame: str) -> str:
    """`name (path/to/file.py:12)` → `name (file.py)`: one entry per function, not per line."""
    name, _, where = frame.partition(" (")
    where = _LINE.sub(")", "(" + where) if where else ""
    path = where.strip("()")
    short = "/".join(path.split("/")[-2:]) if path else ""
    return f"{name} ({short})" if short else name


def top_costs(text: str, *, top: int = 20) -> dict[str, list[tuple[str, float]]]:
    """{"self": [(function, share)], "inclusive": [...]}, shares of all samples."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_function(f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for function in set(frames):
            inclusive[function] += count
    if not total:
        return {"self": [], "inclusive": []}
    return {kind: [(name, round(n / total, 4)) for name, n in counter.most_common(top)]
            for kind, counter in (("self", own), ("inclusive", inclusive))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    costs = top_costs(Path(args.file).read_text(), top=args.top)
    for kind, rows in costs.items():
        print(f"## {kind}")
        for name, share in rows:
            print(f"{share * 100:5.1f} %  {name}")


if __name__ == "__main__":
    main()
