//! A vision-language checkpoint (Qwen2.5-VL) in tch: its language model, a Qwen2
//! decoder whose rotary positions are M-RoPE's (temporal, row, column), and its vision
//! tower, whose features replace the image tokens of a prompt.

use std::path::Path;

use serde_json::Value;
use tch::nn::VarStore;
use tch::{Kind, Tensor};

use super::super::config::ModelConfig;
use super::super::decoder::{CacheStep, CausalLm, Pass};
use super::super::lora::Route;
use super::super::weights::{SafetensorsSet, Weights};
use super::super::{Error, LoadOptions};
use super::layout::{self, Grid};
use super::qwen2_5_vl::{VisionConfig, VisionTower};

/// A Qwen2.5-VL checkpoint loaded from a Hugging Face folder.
pub struct VisionLanguageModel {
    lm: CausalLm,
    /// Owns the language model's tensors.
    _vs: VarStore,
    tower: VisionTower,
    image_token: i64,
    mrope_section: Vec<i64>,
}

impl VisionLanguageModel {
    /// `dir/config.json` (model_type qwen2_5_vl) and its weights.
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<VisionLanguageModel, Error> {
        let file = dir.join("config.json");
        let bad = |reason: String| Error::Config { file: file.clone(), reason };
        let text = std::fs::read_to_string(&file).map_err(|source| Error::io(&file, source))?;
        let raw: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        if raw["model_type"] != "qwen2_5_vl" {
            return Err(bad(format!("model_type {} is not a vision-language model (qwen2_5_vl)", raw["model_type"])));
        }
        let mut text_config = raw["text_config"].clone();
        let mrope_section: Vec<i64> = serde_json::from_value(text_config["rope_parameters"]["mrope_section"].clone())
            .map_err(|e| bad(format!("text_config.rope_parameters.mrope_section: {e}")))?;
        // The language model is a Qwen2 decoder; only its positions differ.
        text_config["model_type"] = "qwen2".into();
        let config = ModelConfig::from_json(&text_config.to_string()).map_err(|e| bad(format!("text_config: {e}")))?;
        if mrope_section.iter().sum::<i64>() * 2 != config.head_dim as i64 {
            return Err(bad(format!(
                "mrope_section {mrope_section:?} does not sum to half the head dim {}",
                config.head_dim
            )));
        }
        let vision: VisionConfig =
            serde_json::from_value(raw["vision_config"].clone()).map_err(|e| bad(format!("vision_config: {e}")))?;
        let image_token = raw["image_token_id"].as_i64().ok_or_else(|| bad("missing key `image_token_id`".into()))?;
        let files = SafetensorsSet::open_dir(dir)?;
        let mut vs = VarStore::new(options.tch_device());
        vs.set_kind(options.kind());
        let lm = CausalLm::new(vs.root(), &config, &Weights::Files(&files))?;
        let tower = VisionTower::load(vision, &files, options.kind(), options.tch_device())?;
        Ok(VisionLanguageModel { lm, _vs: vs, tower, image_token, mrope_section })
    }

    /// The id an image expands into, one per merge block of its patches.
    pub fn image_token(&self) -> i64 {
        self.image_token
    }

    pub fn tower(&self) -> &VisionTower {
        &self.tower
    }

    /// Logits (L, V), float32, of every position of a whole prompt (no cache): each run
    /// of image tokens is the next image of `grids` (its patches in `pixel_values`, image
    /// after image), replaced by its features, every token at its M-RoPE position.
    pub fn prompt_logits(&mut self, ids: &[i64], pixel_values: &Tensor, grids: &[Grid]) -> Result<Tensor, Error> {
        let merge = self.tower.config().spatial_merge_size;
        let positions =
            layout::rope_positions(ids, self.image_token, grids, merge).map_err(|reason| Error::Request { reason })?;
        let features = self.tower.forward(pixel_values, grids)?;
        let device = features.device();
        let ids = Tensor::from_slice(ids).to_device(device).unsqueeze(0);
        let embeddings = self.lm.embed(&ids);
        let images = ids.eq(self.image_token).unsqueeze(-1).expand_as(&embeddings);
        let embeddings = embeddings.masked_scatter(&images, &features.to_kind(embeddings.kind()));
        let positions = Tensor::from_slice(&positions.concat()).to_device(device).reshape([3, 1, -1]);
        let (cos, sin) = self.lm.model.rotary.cos_sin_mrope(&positions, &self.mrope_section, embeddings.kind());
        let route = Route::new(&[None], device, None);
        let pass = Pass { cos, sin, mask: None, causal: true, cache: CacheStep::None, route: &route, packed: false };
        let hidden = self.lm.hidden_of_embeddings(embeddings, &pass);
        Ok(self.lm.head(&hidden.squeeze_dim(0)).to_kind(Kind::Float))
    }
}
