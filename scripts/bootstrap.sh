#!/usr/bin/env bash
# Bootstraps .venv on a fresh machine. python-prctl compiles against libcap, so
# the headers must exist before pip runs; bubblewrap is the command sandbox.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${1:-dev}

need_pkgs=()
[ -f /usr/include/sys/capability.h ] || need_pkgs+=(libcap-dev)
command -v bwrap >/dev/null 2>&1 || need_pkgs+=(bubblewrap)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing system packages: ${need_pkgs[*]}"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
    elif [[ " ${need_pkgs[*]} " == *" libcap-dev "* ]]; then
        echo "bootstrap: python-prctl needs the libcap headers (sys/capability.h)." >&2
        echo "  install them as root:  apt-get install -y libcap-dev   (Fedora: dnf install libcap-devel)" >&2
        echo "  optional, for the command sandbox:  apt-get install -y bubblewrap" >&2
        exit 1
    else
        echo "bootstrap: bubblewrap is missing; sandboxed commands will fail closed (apt-get install -y bubblewrap)" >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
