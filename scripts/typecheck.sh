#!/usr/bin/env bash
# mypy cannot follow setuptools' package-dir mapping (top-level actors/ etc. are
# corral.actors), so give it a symlinked view of the package as it is imported.
set -euo pipefail
cd "$(dirname "$0")/.."
view=build/typecheck/corral
rm -rf build/typecheck && mkdir -p "$view"
for f in corral/*; do ln -s "$PWD/$f" "$view/"; done
for d in actors mailbox sandbox supervisor; do ln -s "$PWD/$d" "$view/$d"; done
MYPYPATH=build/typecheck exec .venv/bin/mypy --cache-dir build/mypy-cache -p corral "$@"
