#!/usr/bin/env bash
# Run the README's first command verbatim, as a new user would on a fresh clone: in a copy of the
# tracked tree (no .venv, no build outputs), so the install is the bare `pip install -e .`.
# Fails if the command fails or prints no table. Its output goes to stdout and, with an argument,
# to that file too (scripts/readme_output.py puts it into the README).
#   bash scripts/readme_first_command.sh [OUTPUT_FILE]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMMAND="$(awk '/^```bash$/ {getline; print; exit}' "$ROOT/README.md" | sed 's/ *#.*$//')"
[[ "$COMMAND" == *"python -m tvjax"* ]] || { echo "README's first command is not the main job: $COMMAND" >&2; exit 1; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - 2>/dev/null) | tar -xf - -C "$WORK"
echo "[readme] in a fresh copy of the tree: $COMMAND" >&2
OUTPUT="$(cd "$WORK" && PY_COLORS=0 bash -c "$COMMAND" 2> >(grep -v "is ignored: it is neither" >&2))"
TABLE="$(sed -n '/^Paper block instance/,$p' <<<"$OUTPUT")"  # pip's own lines come first
echo "$TABLE"
grep -q '^true TV = ' <<<"$TABLE" && grep -q '^sample-only ' <<<"$TABLE" || { echo "[readme] the main job printed no table" >&2; exit 1; }
[[ $# -eq 0 ]] || printf '%s\n' "$TABLE" > "$1"
