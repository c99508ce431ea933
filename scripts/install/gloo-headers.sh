#!/usr/bin/env bash
# Adds gloo's C++ headers to a libtorch install (`scripts/install/gloo-headers.sh DIR`,
# DIR/include/gloo), once. libtorch's ProcessGroupGloo.hpp includes them, and the torch
# wheel does not ship them; csrc/c10d.cpp needs them only to compile (the gloo that runs
# is the one inside libtorch_cpu.so). Debian's libgloo-dev carries them: its .deb is
# downloaded (no root needed), checked by sha256, and only its headers are unpacked.
set -euo pipefail

dest="$1/include/gloo"
[[ -f "$dest/config.h" ]] && exit 0

package="libgloo-dev_0.0~git20220518.5b14351-3_amd64.deb"
sha256="80529c9fd8af452faf489e686b94bf87075965c40673803810c4f41634b1e299"
work="$(mktemp -d "$1/gloo.partial.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "install-gloo-headers: downloading Debian's libgloo-dev (49 kB)" >&2
(cd "$work" && apt-get download -q -q "libgloo-dev=0.0~git20220518.5b14351-3" 2>/dev/null) || {
    echo "install-gloo-headers: apt-get download libgloo-dev failed: the build needs gloo's headers" \
        "(Debian's libgloo-dev); install that package or unpack its usr/include/gloo into $dest" >&2
    exit 1
}
echo "$sha256  $work/$package" | sha256sum --check --quiet
dpkg-deb -x "$work/$package" "$work/unpacked"
mv "$work/unpacked/usr/include/gloo" "$work/gloo"
mv "$work/gloo" "$dest"
echo "install-gloo-headers: gloo's headers are in $dest" >&2
