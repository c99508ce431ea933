//! libtorch's c10d through `csrc/c10d.cpp`: the TCPStore the ranks meet at and the Gloo
//! process group their collectives run on.

use std::ffi::{CStr, CString, c_char, c_void};
use std::time::Duration;

use tch::Tensor;
use torch_sys::C_tensor;

unsafe extern "C" {
    fn petting_free_error(message: *mut c_char);
    fn petting_store_connect(
        host: *const c_char,
        port: u16,
        is_server: bool,
        world: i64,
        timeout_ms: i64,
        out: *mut *mut c_void,
    ) -> *mut c_char;
    fn petting_store_free(store: *mut c_void);
    fn petting_store_prefixed(store: *mut c_void, prefix: *const c_char, out: *mut *mut c_void) -> *mut c_char;
    fn petting_store_set(store: *mut c_void, key: *const c_char, data: *const u8, len: usize) -> *mut c_char;
    fn petting_store_get(
        store: *mut c_void,
        key: *const c_char,
        timeout_ms: i64,
        data: *mut *mut u8,
        len: *mut usize,
    ) -> *mut c_char;
    fn petting_free_bytes(data: *mut u8);
    fn petting_store_check(store: *mut c_void, key: *const c_char, present: *mut bool) -> *mut c_char;
    fn petting_gloo_new(
        store: *mut c_void,
        master: *const c_char,
        rank: i64,
        world: i64,
        timeout_ms: i64,
        out: *mut *mut c_void,
    ) -> *mut c_char;
    fn petting_gloo_free(group: *mut c_void);
    fn petting_allreduce_sum(group: *mut c_void, tensor: *const C_tensor) -> *mut c_char;
    fn petting_broadcast(group: *mut c_void, tensor: *const C_tensor, root: i64) -> *mut c_char;
}

/// What c10d said when a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct C10dError(pub String);

impl std::fmt::Display for C10dError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // c10d's messages carry a C++ backtrace after the first line.
        f.write_str(self.0.lines().next().unwrap_or_default())
    }
}

impl std::error::Error for C10dError {}

/// Ok, or the message a `csrc/` function returned (freed).
fn checked(error: *mut c_char) -> Result<(), C10dError> {
    if error.is_null() {
        return Ok(());
    }
    let message = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
    unsafe { petting_free_error(error) };
    Err(C10dError(message))
}

fn c_string(s: &str) -> CString {
    CString::new(s).expect("c10d keys and hosts hold no NUL")
}

fn millis(timeout: Duration) -> i64 {
    i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)
}

/// A connection to the rendezvous TCPStore, which rank 0 serves.
pub struct Store {
    raw: *mut c_void,
}

// The store's client serialises its own calls; petting calls it from one thread at a time.
unsafe impl Send for Store {}
unsafe impl Sync for Store {}

impl Store {
    /// Connects to the store at `host:port` (serving it when `serve`), retrying for up to
    /// `timeout` while the server is not up.
    pub fn connect(host: &str, port: u16, serve: bool, world: u32, timeout: Duration) -> Result<Store, C10dError> {
        let mut raw = std::ptr::null_mut();
        let host = c_string(host);
        checked(unsafe {
            petting_store_connect(host.as_ptr(), port, serve, i64::from(world), millis(timeout), &mut raw)
        })?;
        Ok(Store { raw })
    }

    /// The same store with every key under `prefix`.
    pub fn prefixed(&self, prefix: &str) -> Result<Store, C10dError> {
        let mut raw = std::ptr::null_mut();
        let prefix = c_string(prefix);
        checked(unsafe { petting_store_prefixed(self.raw, prefix.as_ptr(), &mut raw) })?;
        Ok(Store { raw })
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), C10dError> {
        let key = c_string(key);
        checked(unsafe { petting_store_set(self.raw, key.as_ptr(), value.as_ptr(), value.len()) })
    }

    /// The value of `key`, waiting up to `timeout` for some rank to set it.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, C10dError> {
        let key = c_string(key);
        let (mut data, mut len) = (std::ptr::null_mut(), 0usize);
        checked(unsafe { petting_store_get(self.raw, key.as_ptr(), millis(timeout), &mut data, &mut len) })?;
        let value = unsafe { std::slice::from_raw_parts(data, len) }.to_vec();
        unsafe { petting_free_bytes(data) };
        Ok(value)
    }

    /// Whether some rank has set `key`, without waiting.
    pub fn has(&self, key: &str) -> Result<bool, C10dError> {
        let key = c_string(key);
        let mut present = false;
        checked(unsafe { petting_store_check(self.raw, key.as_ptr(), &mut present) })?;
        Ok(present)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        unsafe { petting_store_free(self.raw) }
    }
}

/// A Gloo process group: the ranks' collectives over TCP.
pub struct ProcessGroup {
    raw: *mut c_void,
}

unsafe impl Send for ProcessGroup {}
unsafe impl Sync for ProcessGroup {}

impl ProcessGroup {
    /// The group of `world` ranks meeting at `store` (every rank calls this; it returns
    /// once all are connected); each collective fails after `timeout`.
    pub fn gloo(store: &Store, master: &str, rank: u32, world: u32, timeout: Duration) -> Result<Self, C10dError> {
        let mut raw = std::ptr::null_mut();
        let master = c_string(master);
        checked(unsafe {
            petting_gloo_new(store.raw, master.as_ptr(), i64::from(rank), i64::from(world), millis(timeout), &mut raw)
        })?;
        Ok(ProcessGroup { raw })
    }

    /// Sums `tensor` (contiguous, on the CPU) over every rank, in place.
    pub fn all_reduce_sum(&self, tensor: &Tensor) -> Result<(), C10dError> {
        checked(unsafe { petting_allreduce_sum(self.raw, tensor.as_ptr()) })
    }

    /// Gives every rank `root`'s `tensor`, in place.
    pub fn broadcast(&self, tensor: &Tensor, root: u32) -> Result<(), C10dError> {
        checked(unsafe { petting_broadcast(self.raw, tensor.as_ptr(), i64::from(root)) })
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        unsafe { petting_gloo_free(self.raw) }
    }
}
