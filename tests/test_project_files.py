"""Project files speak of the project only: no numbered diary entries or references to a working
session in any tracked text file (history belongs in git and CHANGELOG.md)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIARY = re.compile(r"\bstop [0-9]+|\bthis session\b|\bfinal run\b|\bearlier runs? of stop\b", re.IGNORECASE)
BINARY = (".png", ".jpg", ".gguf", ".zarr", ".npz", ".npy", ".pdf", ".ico", ".woff", ".woff2")


def tracked_text_files():
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, names):
        path = ROOT / name
        if path.is_file() and not name.endswith(BINARY):
            try:
                yield name, path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue


def diary_lines(files):
    return [f"{name}:{number}: {line.strip()}" for name, text in files
            for number, line in enumerate(text.splitlines(), 1) if DIARY.search(line)]


def test_no_tracked_text_file_holds_a_diary_entry():
    files = list(tracked_text_files())
    assert len(files) > 100 and any(name == "README.md" for name, _ in files)
    found = diary_lines(files)
    assert not found, "diary words in project files (history belongs in git and CHANGELOG.md):\n" + "\n".join(found)


def test_the_check_catches_each_pattern():
    # split literals, so that this file does not match itself
    planted = [("a.md", "what stop " "29 measured"), ("b.py", "# as in this " "session"), ("c.md", "its final " "run:"),
               ("d.md", "the trajectories stop at EOS"), ("e.md", "top-k 20 and stop " "0.2 vs 0.3")]
    assert [line.split(":")[0] for line in diary_lines(planted)] == ["a.md", "b.py", "c.md", "e.md"]
