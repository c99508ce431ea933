//! Integration tests: the library through its public API, and the real binary.

#[path = "../support/mod.rs"]
mod support;

mod agent_programs;
mod architecture;
mod cli_config;
mod cli_sql;
mod critic;
mod data_parallel;
mod docs;
mod env_host;
mod generation;
mod hosted;
mod independent_reader;
mod libtorch;
mod model;
mod overlap;
mod pipeline;
mod real_model;
mod scale_out;
mod stages;
mod store;
mod ui;
mod update;
mod vllm;
