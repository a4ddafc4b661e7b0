#!/usr/bin/env bash
# A variant wheel for scripts/ab16/run.sh: this checkout's HEAD with text replacements in
# quick_core/consumer/config.py (each argument 'OLD=>NEW'), built into .dev/var/NAME.
#   bash scripts/ab16/variant.sh A                       # HEAD unchanged
#   bash scripts/ab16/variant.sh flush 'completion_flush_s: float = 0.01=>completion_flush_s: float = 0.0'
# Then (with scripts/scale16-pack's .dev/ and the variants there):
#   bash scripts/ab16/run.sh                              # on the 16-core machine, carry .dev
set -eu
root=$(git rev-parse --show-toplevel); cd "$root"
name=$1; shift
src=$(mktemp -d)
git archive HEAD | tar -x -C "$src"
python3 - "$src/quick_core/consumer/config.py" "$@" <<'PY'
import sys
path, subs = sys.argv[1], sys.argv[2:]
text = open(path).read()
for sub in subs:
    old, new = sub.split("=>")
    if old not in text:
        sys.exit(f"not in config.py: {old!r}")
    text = text.replace(old, new, 1)
open(path, "w").write(text)
PY
mkdir -p ".dev/var/$name"; rm -f ".dev/var/$name"/*.whl
${PYTHON:-python3} -m pip wheel -q --no-deps -w ".dev/var/$name" "$src"
rm -rf "$src"
ls ".dev/var/$name"
