//! The tiny Qwen2.5-VL checkpoint `tests/fixtures/make_vlm_fixtures.py` made with
//! transformers, and the reference outputs it computed.

use std::path::PathBuf;
use std::sync::Arc;

use tch::{Device, Tensor};

use super::super::weights::SafetensorsSet;
use super::super::{LanguageModel, LoadOptions, PromptImages};
use super::layout::Grid;

pub(super) fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf-tiny-qwen2_5_vl")
}

pub(super) fn reference(name: &str) -> Tensor {
    let set = SafetensorsSet::open_files(&[fixture().join("reference.safetensors")]).unwrap();
    let (shape, kind) = set.info(name).unwrap();
    let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    set.tensor(name, &shape, kind, Device::Cpu).unwrap()
}

pub(super) fn grids() -> Vec<Grid> {
    let grid = reference("image_grid_thw");
    let flat = Vec::<i64>::try_from(grid.reshape([-1])).unwrap();
    flat.chunks(3).map(|g| Grid { t: g[0] as usize, h: g[1] as usize, w: g[2] as usize }).collect()
}

/// The reference's two images.
pub(super) fn images() -> Arc<PromptImages> {
    let pixel_values = Vec::<f32>::try_from(reference("pixel_values").reshape([-1])).unwrap();
    Arc::new(PromptImages { key: "two".into(), pixel_values, grids: grids() })
}

pub(super) fn policy() -> LanguageModel {
    LanguageModel::load(&fixture(), &LoadOptions::default()).unwrap()
}
