# Sourced (not run) by the set-up scripts, from the repository root.
#
# The heavy ignored folders (libtorch, the Python environments, the model files and
# cargo's target folder) live in one cache per machine and the checkout links to them,
# so another clone on the same machine (CI's, right after a session) reuses the ~45
# minute build and the 7 GB of installs instead of redoing them. The install scripts
# resolve the links and install into the cache; a folder that is already a real
# directory in the checkout is used as it is. PETTING_MACHINE_CACHE moves the cache.
petting_machine_cache="${PETTING_MACHINE_CACHE:-$HOME/.cache/petting-machine}"
for petting_cached in .libtorch .venv .vllm .mlflow .wandb .models target; do
    if [[ ! -e "$petting_cached" && ! -L "$petting_cached" ]]; then
        mkdir -p "$petting_machine_cache/$petting_cached"
        ln -s "$petting_machine_cache/$petting_cached" "$petting_cached"
    fi
done
# The resolved path, not the link: torch-sys rebuilds its C++ bindings whenever LIBTORCH
# changes, and every clone's own path would change it.
LIBTORCH="$(readlink -f .libtorch)"
export LIBTORCH
unset petting_cached
