//! Gives every binary of this crate (the CLI, tests, benches) an rpath to the
//! libtorch that torch-sys linked against, so they run without LD_LIBRARY_PATH, and
//! keeps libtorch's CUDA backend linked when building against the CUDA libtorch.

use std::path::Path;

fn main() {
    // torch-sys declares `links = "tch"` and reports its lib folder as `libtorch_lib`.
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else { return };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    // Nothing of ours calls into libtorch_cuda.so directly, so the linker's --as-needed
    // drops it and the CUDA backend never registers: tch then reports no GPU.
    if Path::new(&lib).join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
