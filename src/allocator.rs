//! glibc malloc settings for a process that allocates and frees large tensors in a loop.
//!
//! By default glibc serves every large allocation with a fresh `mmap` and returns it with
//! `munmap` when freed, so each training step faults in every page of its activations
//! again: 13–27% of a 134M-parameter training step on a 2-core VM, measured with torch.
//! Serving them from the heap, and never trimming it, keeps those pages mapped between
//! steps. A process that runs one stage keeps its peak until it exits; `pipeline run`,
//! which runs every stage in one process, hands it back after each stage
//! ([`return_freed_memory`]), or the rollout would sit on the update's peak.

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

/// Returns the heap's free pages to the system, at the end of a stage whose peak the next
/// one does not need: after a full-weight update of a 0.5B model (22 GiB at its peak) the
/// rollout held 17 GiB without this (and the gradients AdamW now releases) and 3.2 GiB
/// with it (BENCHMARKS.md, "A pipeline's stages in one process").
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory malloc holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}
