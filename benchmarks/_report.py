"""Write a benchmark report: JSON to `out` (or stdout when there is none), then the table."""

import json
from pathlib import Path


def write_report(report: dict, out: Path | None, table: str) -> None:
    text = json.dumps(report, indent=1)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    else:
        print(text)
    print(table)
    if out is not None:
        print(f"wrote {out}")
