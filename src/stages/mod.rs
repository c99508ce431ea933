//! Pipeline stages: plain functions that read committed tables from a `RunStore` and
//! commit their own.

pub mod prepare_data;
