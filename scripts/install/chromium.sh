#!/usr/bin/env bash
# Debian's Chromium and its chromedriver, which the dashboard's tests drive over WebDriver
# (tests/it/ui.rs): /usr/bin/chromium and /usr/bin/chromedriver, about 300 MB, once.
set -euo pipefail
if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
    exit 0
fi
sudo=()
[[ $(id -u) == 0 ]] || sudo=(sudo)
echo "installing Debian's chromium and chromium-driver for the dashboard's browser tests (about a minute)" >&2
export DEBIAN_FRONTEND=noninteractive
if ! "${sudo[@]}" apt-get install -y -qq chromium chromium-driver >&2; then
    "${sudo[@]}" apt-get update -qq >&2
    "${sudo[@]}" apt-get install -y -qq chromium chromium-driver >&2
fi
