"""Make tests/file_seconds.json, the seconds each test file took in a full run, from that run's
`--durations=0` report (setup, call and teardown summed per file). tests/conftest.py hands out
the longest files first by it; only the order matters, so a file renamed or new since runs with
those of unknown length, and the table is made again when the order has grown stale:

    python -m pytest --durations=0 | tee run.log
    python tests/file_seconds.py < run.log
"""

import json
import re
import sys
from pathlib import Path

DURATION = re.compile(r"([\d.]+)s (?:setup|call|teardown)\s+([^:\s]+)::")
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
LEAST = 3  # seconds: files shorter than this are left out (their order hardly matters)


def main() -> None:
    seconds: dict[str, float] = {}
    for line in sys.stdin:
        if found := DURATION.match(line):
            seconds[found[2]] = seconds.get(found[2], 0.0) + float(found[1])
    if not seconds:
        sys.exit("no --durations=0 lines in the input")
    longest = sorted(seconds.items(), key=lambda item: -item[1])
    table = {name: round(took) for name, took in longest if took >= LEAST}
    FILE_SECONDS.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{FILE_SECONDS}: {len(table)} files, {round(sum(seconds.values()))} s in all")


if __name__ == "__main__":
    main()
