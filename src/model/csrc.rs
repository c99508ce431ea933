//! The C++ of `csrc/`, built by `build.rs` against the same libtorch: libtorch ops tch
//! does not bind, and petting's own CPU kernels. Tensors cross as tch's pointers; each
//! function returns a null pointer or an error message ([`tensor_from`] takes it back).

use std::ffi::{CStr, c_char};

use tch::{TchError, Tensor};
use torch_sys::C_tensor;

unsafe extern "C" {
    fn petting_free_error(message: *mut c_char);
    pub(crate) fn petting_onednn_available() -> bool;
    pub(crate) fn petting_pack_linear_weight(weight: *const C_tensor, packed: *mut *mut C_tensor) -> *mut c_char;
    pub(crate) fn petting_packed_linear(
        x: *const C_tensor,
        packed: *const C_tensor,
        bias: *const C_tensor,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
    pub(crate) fn petting_decode_attention(
        q: *const C_tensor,
        keys: *const C_tensor,
        values: *const C_tensor,
        last: *const C_tensor,
        shared_slot: *const C_tensor,
        shared_len: *const C_tensor,
        scale: f64,
        out: *mut *mut C_tensor,
    ) -> *mut c_char;
}

/// The tensor a C++ function writes through the pointer `call` passes it, or the
/// function's error message (freed).
pub(crate) fn tensor_from(call: impl FnOnce(*mut *mut C_tensor) -> *mut c_char) -> Result<Tensor, TchError> {
    let mut out = std::ptr::null_mut();
    let error = call(&mut out);
    if error.is_null() {
        return Ok(unsafe { Tensor::from_ptr(out) });
    }
    let message = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
    unsafe { petting_free_error(error) };
    Err(TchError::Torch(message))
}
