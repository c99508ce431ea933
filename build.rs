//! Gives every binary of this crate (the CLI, tests, benches) an rpath to the
//! libtorch that torch-sys linked against, so they run without LD_LIBRARY_PATH, keeps
//! libtorch's CUDA backend linked when building against the CUDA libtorch, and compiles
//! the C++ in `csrc/` against the same libtorch.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    // torch-sys declares `links = "tch"` and reports its lib folder as `libtorch_lib`.
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else { return };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    // Nothing of ours calls into libtorch_cuda.so directly, so the linker's --as-needed
    // drops it and the CUDA backend never registers: tch then reports no GPU.
    let cuda = Path::new(&lib).join("libtorch_cuda.so").exists();
    if cuda {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
    // libtorch reports no CUDA both where it was built without it and where it sees no
    // GPU; the error for a device petting cannot use tells the two apart by this.
    println!("cargo:rustc-env=PETTING_LIBTORCH_VARIANT={}", if cuda { "cuda" } else { "cpu" });
    let include = Path::new(&lib).parent().expect("libtorch's lib folder has a parent").join("include");
    // torch-sys builds its own C++ with the same flags (the PyPI wheels use the C++11 ABI).
    if !include.join("gloo/config.h").exists() {
        panic!(
            "{} has no gloo headers, which csrc/c10d.cpp compiles against: run scripts/install/gloo-headers.sh {}",
            include.display(),
            include.parent().expect("include has a parent").display()
        );
    }
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(&include)
        // The C++ frontend's headers, which c10d's include.
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        // ProcessGroupGloo.hpp declares its class only under this (libtorch defines it).
        .flag("-DUSE_C10D_GLOO")
        // Products may fuse into FMA instructions (the kernels' sums are not bit-pinned).
        .flag("-ffp-contract=fast")
        // at::parallel_for is inline OpenMP in libtorch's headers: without the flag its
        // pragma is ignored and a kernel runs on one thread.
        .flag("-fopenmp")
        .opt_level(3)
        .files(["csrc/ffi.cpp", "csrc/onednn_linear.cpp", "csrc/decode_attention.cpp", "csrc/c10d.cpp"])
        .compile("petting_csrc");
    println!("cargo:rustc-link-lib=torch_cpu");
    println!("cargo:rustc-link-lib=c10");
    // The OpenMP runtime libtorch loads (libgomp.so.1 in its lib folder, found by the
    // rpath), so the kernels share libtorch's thread pool.
    println!("cargo:rustc-link-lib=gomp");
}
