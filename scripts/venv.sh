# Sourced by the scripts: creates (or reuses) the project's virtualenv and sets VENV and PY.
# PEP 668 interpreters (Debian/Ubuntu's python3, Homebrew's) refuse `pip install` outside a
# virtualenv, so nothing is ever installed into the system interpreter.
VENV="${OUTBOXKIT_VENV:-$PWD/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating the virtualenv $VENV with $(command -v python3) ($(python3 -V 2>&1))"
  if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
    # Debian and Ubuntu ship venv's pip bootstrap separately (python3-venv).
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "installing python3-venv (apt)"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      rm -rf "$VENV"
      python3 -m venv "$VENV"
    else
      echo "python3 -m venv failed: install python3-venv (Debian/Ubuntu: sudo apt-get install python3-venv)" >&2
      exit 2
    fi
  fi
fi
PY="$VENV/bin/python"
export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
echo "virtualenv: $VENV (afterwards: source $VENV/bin/activate, or run $VENV/bin/outboxkit)"
