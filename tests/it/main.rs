//! Integration tests: the library through its public API, and the real binary.

#[path = "../support/mod.rs"]
mod support;

mod independent_reader;
mod libtorch;
mod store;
