#!/usr/bin/env bash
# The console's browser test (tests/integration/test_console_browser.py) drives Debian's Chromium
# headless through Playwright for Python (pinned in constraints.txt; its own browser download,
# `playwright install`, is never used). Installs the chromium package when it is missing. Root.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "browser: /usr/bin/chromium is missing; install Debian's chromium package as root (apt-get install chromium)" >&2
    exit 1
fi
echo "browser: installing chromium" >&2
apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
