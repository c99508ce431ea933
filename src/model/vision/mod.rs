//! Vision-language models: the vision towers that turn an image's patches into
//! language-model embeddings, and where each patch and prompt token sits (`layout`).

#[cfg(test)]
mod fixture;
pub mod layout;
mod model;
mod processor;
mod qwen2_5_vl;

pub use layout::Grid;
pub use model::PromptImages;
pub(crate) use model::{ImagePrompt, RowImages, Vision, read_config};
pub use processor::{Image, ImageProcessor};
pub use qwen2_5_vl::{VisionConfig, VisionTower};
