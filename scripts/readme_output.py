"""Put the main job's real output into README.md, between its markers.

    python scripts/readme_output.py                 # runs `python -m tvjax` with this interpreter
    python scripts/readme_output.py --from FILE     # a run's saved output (scripts/readme_first_command.sh FILE)

tests/test_docs.py checks that the block has the main job's format (tvjax.cli.header and format_row).
"""

import argparse
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- main-job-output:start -->", "<!-- main-job-output:end -->"


def with_output(text, output):
    """README text with the fenced `output` between the markers."""
    head, start, rest = text.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"README.md lacks the markers {START} ... {END}")
    return f"{head}{START}\n```\n{output.strip()}\n```\n{END}{tail}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", default=None, help="a saved output of the main job")
    args = parser.parse_args()
    if args.source:
        output = Path(args.source).read_text()
    else:
        output = subprocess.run([sys.executable, "-m", "tvjax"], check=True, capture_output=True, text=True).stdout
    README.write_text(with_output(README.read_text(), output))
    print(output.strip())


if __name__ == "__main__":
    main()
