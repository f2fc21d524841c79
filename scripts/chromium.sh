#!/usr/bin/env bash
# Headless Chromium and its driver from Debian's packages, for the console's browser tests
# (tests/integration/test_console.py drives /usr/bin/chromium with Playwright; never `playwright install`).
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "chromium.sh: installing chromium needs root (apt-get install chromium chromium-driver)" >&2; exit 1; fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
