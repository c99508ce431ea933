//! The tiny Qwen2.5-VL checkpoint `tests/fixtures/make_vlm_fixtures.py` made with
//! transformers, and the reference outputs it computed.

use std::path::PathBuf;
use std::sync::Arc;

use tch::{Device, Tensor};

use super::super::weights::SafetensorsSet;
use super::super::{LanguageModel, LoadOptions, PromptImages};
use super::layout::Grid;
use super::processor::Image;

pub(super) fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf-tiny-qwen2_5_vl")
}

pub(super) fn reference(name: &str) -> Tensor {
    read("reference.safetensors", name)
}

/// Image i of `processor.safetensors`, and the processor's pixel values and grid of it.
pub(super) fn processor_case(i: usize) -> (Image, Tensor, Grid) {
    let raw = read("processor.safetensors", &format!("image_{i}"));
    let (height, width) = (raw.size()[0] as usize, raw.size()[1] as usize);
    let image = Image::new(width, height, Vec::<u8>::try_from(raw.reshape([-1])).unwrap()).unwrap();
    let grid = Vec::<i64>::try_from(read("processor.safetensors", &format!("grid_{i}"))).unwrap();
    let grid = Grid { t: grid[0] as usize, h: grid[1] as usize, w: grid[2] as usize };
    (image, read("processor.safetensors", &format!("pixel_values_{i}")), grid)
}

fn read(file: &str, name: &str) -> Tensor {
    let set = SafetensorsSet::open_files(&[fixture().join(file)]).unwrap();
    let (shape, kind) = set.info(name).unwrap();
    let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    set.tensor(name, &shape, kind, Device::Cpu).unwrap()
}

pub(super) fn grids() -> Vec<Grid> {
    let grid = reference("image_grid_thw");
    let flat = Vec::<i64>::try_from(grid.reshape([-1])).unwrap();
    flat.chunks(3).map(|g| Grid { t: g[0] as usize, h: g[1] as usize, w: g[2] as usize }).collect()
}

/// The largest absolute gap between `ours` and `expected`, and `expected`'s largest value.
pub(super) fn gap_and_scale(ours: &Tensor, expected: &Tensor) -> (f64, f64) {
    ((ours - expected).abs().max().double_value(&[]), expected.abs().max().double_value(&[]))
}

/// The reference's two images.
pub(super) fn images() -> Arc<PromptImages> {
    let pixel_values = Vec::<f32>::try_from(reference("pixel_values").reshape([-1])).unwrap();
    Arc::new(PromptImages { key: "two".into(), pixel_values, grids: grids() })
}

pub(super) fn policy() -> LanguageModel {
    LanguageModel::load(&fixture(), &LoadOptions::default()).unwrap()
}
