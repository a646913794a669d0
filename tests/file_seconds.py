"""Make tests/file_seconds.json, the seconds each test file took in a full run, from that run's
`--durations=0` report (tests/conftest.py hands out the longest files first):

    python -m pytest --durations=0 | tee run.log
    python tests/file_seconds.py < run.log
"""

import json
import re
import sys
from pathlib import Path

DURATION = re.compile(r"([\d.]+)s (?:setup|call|teardown)\s+([^:\s]+)::")
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
    target = Path(__file__).with_name("file_seconds.json")
    target.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{target}: {len(table)} files, {round(sum(seconds.values()))} s in all")


if __name__ == "__main__":
    main()
