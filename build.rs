//! Gives every binary of this crate (the CLI, tests, benches) an rpath to the
//! libtorch that torch-sys linked against, so they run without LD_LIBRARY_PATH.

fn main() {
    // torch-sys declares `links = "tch"` and reports its lib folder as `libtorch_lib`.
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
