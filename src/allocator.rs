//! glibc malloc settings for a process that allocates and frees large tensors in a loop.
//!
//! By default glibc serves every large allocation with a fresh `mmap` and returns it with
//! `munmap` when freed, so each training step faults in every page of its activations
//! again: 13–27% of a 134M-parameter step on these VMs (`../shared/bench/ANCHORS.md`).
//! Serving them from the heap, and never trimming it, keeps those pages mapped between
//! steps; the process keeps its peak memory until it exits, which a pipeline stage does.

/// Serves large allocations from the heap and keeps freed memory for reuse. Call once,
/// before the first tensor. A user who sets `GLIBC_TUNABLES` keeps their own settings.
pub fn keep_freed_memory() {
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes malloc's thresholds; it is called before other threads
    // allocate.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
