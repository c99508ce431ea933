#!/usr/bin/env bash
# Installs libtorch 2.11.0 (CPU) into .libtorch/ from the PyPI wheels, once.
# `scripts/install/libtorch.sh cuda` installs the CUDA 13 build into .libtorch-cuda/
# instead: every library of the torch wheel and of the nvidia wheels it depends on
# (about 4 GB), for `LIBTORCH=$PWD/.libtorch-cuda cargo build --release --target-dir
# target-cuda` (docs/gpu.md).
#
# tch 0.24 binds libtorch 2.11.0. pytorch.org's libtorch zips cannot be reached from
# our machines, but PyPI can: the torch wheel carries the same shared libraries and
# headers. We keep torch/lib and torch/include, drop libtorch_cuda*.so so torch-sys
# links the CPU build, and add the two CUDA runtime libraries libtorch_cpu.so is linked
# against (it only loads them; no GPU is used). The wheels are pinned by sha256.
#
# gloo's headers, which csrc/c10d.cpp compiles against, come from scripts/install/gloo-headers.sh.
#
# Idempotent: a complete install (marked by .libtorch/build-version) is left alone.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
variant="${1:-cpu}"
case "$variant" in
    cpu) dest="$(readlink -f "$root/.libtorch")" ;;
    cuda) dest="$(readlink -f "$root/.libtorch-cuda")" ;;
    *) echo "usage: scripts/install/libtorch.sh [cpu|cuda]" >&2; exit 2 ;;
esac
version="2.11.0"

if [[ -f "$dest/build-version" && "$(cat "$dest/build-version")" == "$version" ]]; then
    "$root/scripts/install/gloo-headers.sh" "$dest"
    exit 0
fi

# The wheels (545 MB, twice while pip moves them) and the unpacked libraries (500 MB) are
# written beside the checkout, pip's temporary files included: a small /tmp then cannot fail
# the install, and the final mv is a rename.
need_mib=1700
[[ "$variant" == cpu ]] || need_mib=9000
free_mib=$(df --output=avail -m "$(dirname "$dest")" | tail -n 1 | tr -d ' ')
if ((free_mib < need_mib)); then
    echo "install-libtorch: needs about $need_mib MiB free on the disk of $root for the torch wheel and" \
        "the unpacked libraries, and the build after it (scripts/test.sh) needs about 4 GiB more; df reports $free_mib MiB free" >&2
    exit 1
fi

python="${PYTHON:-python3}"
work="$(mktemp -d "$dest.partial.XXXXXX")"
trap 'rm -rf "$work"' EXIT

cat > "$work/requirements.txt" <<REQ
torch==$version --hash=sha256:7aa2f9bbc6d4595ba72138026b2074be1233186150e9292865e04b7a63b8c67a
nvidia-cuda-runtime==13.0.96 --hash=sha256:7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548
nvidia-cuda-cupti==13.0.85 --hash=sha256:4eb01c08e859bf924d222250d2e8f8b8ff6d3db4721288cf35d14252a4d933c8
REQ

# The wheel's libtorch is the same for every CPython; pinning the tag makes the hashes hold
# whatever python3 this machine has. Without --no-cache-dir pip would also buffer the wheel
# in a temporary file and keep a third copy in its cache.
# With --platform, pip accepts only the tags named, not the older ones a manylinux_2_28
# machine also runs: name them all (the nvidia wheels use 2_17, 2_18 and 2_27).
platform=(--python-version 3.11 --implementation cp --abi cp311 --platform manylinux2014_x86_64)
for glibc in $(seq 17 28); do platform+=(--platform "manylinux_2_${glibc}_x86_64"); done
if [[ "$variant" == cpu ]]; then
    echo "install-libtorch: downloading torch $version wheels from PyPI (about 545 MB)" >&2
    TMPDIR="$work" "$python" -m pip download --quiet --no-cache-dir --no-deps --only-binary=:all: "${platform[@]}" \
        --require-hashes -r "$work/requirements.txt" -d "$work/wheels"
else
    # The nvidia wheels are the exact versions the torch wheel's metadata pins; pip
    # resolves them (and torch's small pure-Python dependencies, which are not unpacked).
    echo "install-libtorch: downloading torch $version and its nvidia wheels from PyPI (about 4 GB)" >&2
    TMPDIR="$work" "$python" -m pip download --quiet --no-cache-dir --only-binary=:all: "${platform[@]}" \
        "torch==$version" -d "$work/wheels"
fi

staging="$work/libtorch"
mkdir -p "$staging/lib"
echo "install-libtorch: unpacking" >&2
(cd "$work" && "$python" - "$work/wheels" "$staging" "$variant" <<'PY'
import pathlib, shutil, sys, zipfile

wheels, staging, variant = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
CUDA_LIBS = ("libtorch_cuda", "libc10_cuda", "libtorch_nvshmem", "libcaffe2_nvrtc")
(torch_wheel,) = wheels.glob("torch-*.whl")
with zipfile.ZipFile(torch_wheel) as z:
    for name in z.namelist():
        if name.endswith("/"):
            continue
        if name.startswith("torch/include/"):
            target = staging / name[len("torch/"):]
        elif name.startswith("torch/lib/") and name.count("/") == 2:
            base = name[len("torch/lib/"):]
            # The CUDA libraries make torch-sys link the CUDA build; libtorch_python needs Python.
            if base.startswith("libtorch_python") or (variant == "cpu" and base.startswith(CUDA_LIBS)):
                continue
            target = staging / "lib" / base
        else:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with z.open(name) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
def unpack_nvidia(wheel, keep):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            base = name.rsplit("/", 1)[-1]
            if name.startswith("nvidia/") and "/lib/" in name and ".so" in base and keep(base):
                with z.open(name) as src, open(staging / "lib" / base, "wb") as dst:
                    shutil.copyfileobj(src, dst)

if variant == "cpu":
    for pattern, lib in [("nvidia_cuda_runtime-*.whl", "libcudart.so.13"),
                         ("nvidia_cuda_cupti-*.whl", "libcupti.so.13")]:
        (wheel,) = wheels.glob(pattern)
        unpack_nvidia(wheel, lambda base: base == lib)
else:
    for wheel in wheels.glob("nvidia_*.whl"):
        unpack_nvidia(wheel, lambda base: True)
PY
)
echo "$version" > "$staging/build-version"

rm -rf "$dest"
mv "$staging" "$dest"
"$root/scripts/install/gloo-headers.sh" "$dest"
echo "install-libtorch: libtorch $version ($variant) is in $dest" >&2
