//! Integration tests: the library through its public API, and the real binary.

mod libtorch;
