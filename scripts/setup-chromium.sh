#!/usr/bin/env bash
# Install Debian's headless-capable Chromium (and its chromedriver) for the dashboard browser test
# (tests/test_dashboards.py). Idempotent: does nothing when `chromium` is already on PATH.
#   sudo scripts/setup-chromium.sh        # or as root in CI, before `make test`
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    echo "chromium already installed: $(command -v chromium) ($(chromium --version 2>/dev/null || echo '?'))"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "error: run as root (apt-get needs it) or install sudo" >&2; exit 1; }
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core
command -v chromium >/dev/null 2>&1 || { echo "error: chromium still not on PATH after apt-get" >&2; exit 1; }
echo "installed: $(command -v chromium) ($(chromium --version 2>/dev/null || echo '?'))"
