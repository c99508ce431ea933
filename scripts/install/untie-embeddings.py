"""Writes a copy of a Hugging Face folder whose LM head is its own tensor (a copy of the
tied embedding): the same model, in the form vLLM 0.32 can reload in place (its reload
leaves a tied LM head stale). Used by scripts/test.sh for the full-weight vLLM test.

    python scripts/install/untie-embeddings.py SOURCE_DIR DEST_DIR
"""
import json
import pathlib
import shutil
import sys

from safetensors.torch import load_file, save_file

source, dest = map(pathlib.Path, sys.argv[1:3])
partial = dest.with_name(dest.name + ".partial")
shutil.rmtree(partial, ignore_errors=True)
partial.mkdir(parents=True)
for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
    if (source / name).exists():
        shutil.copy(source / name, partial / name)
config = json.loads((source / "config.json").read_text())
config["tie_word_embeddings"] = False
(partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
weights = load_file(source / "model.safetensors")
weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
save_file(weights, partial / "model.safetensors", metadata={"format": "pt"})
partial.rename(dest)
