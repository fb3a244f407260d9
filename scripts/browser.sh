#!/usr/bin/env bash
# The headless browser the dashboard's test drives (tests/e2e/test_operator_views.py): Debian's
# Chromium and its WebDriver (`chromium`, `chromium-driver`), installed with apt when missing
# (as root; scripts/apt_install.sh), as scripts/images.sh installs Docker. Quick when present:
# two `command -v` checks. Selenium (a dev dependency) drives the system Chromium; nothing is
# downloaded at test time.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/apt_install.sh" chromium=chromium chromedriver=chromium-driver >/dev/null
