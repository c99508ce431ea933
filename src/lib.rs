//! petting: on-policy multi-agent RL (AT-GRPO) as a batch pipeline over run stores.
//!
//! The library never prints; the `petting` binary (src/main.rs, src/cli/) does.
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod agent;
pub mod algo;
pub mod allocator;
pub mod config;
pub mod contain;
pub mod critic;
pub mod engine;
pub mod envs;
pub mod inspect;
pub mod limits;
pub mod model;
pub mod pipeline;
pub mod play;
pub mod policies;
pub mod progress;
pub mod ranks;
pub mod rng;
pub mod sandbox;
pub mod schema;
pub mod sql;
pub mod stages;
pub mod store;
pub mod tables;
pub mod tasks;
pub mod tracking;
pub mod ui;
pub mod validate;
pub mod workflows;

/// Recorded in every commit marker.
pub const CODE_VERSION: &str = concat!("petting ", env!("CARGO_PKG_VERSION"));
