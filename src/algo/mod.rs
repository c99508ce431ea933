//! The algorithm as pure functions over slices: which candidates are compared with each
//! other, their advantages, and the PPO-clip terms. Stages apply the same formulas to
//! Arrow columns and tensors; tests keep the two equal.

pub mod advantage;
pub mod grouping;
pub mod loss;
