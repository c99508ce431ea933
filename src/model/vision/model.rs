//! The vision part of a vision-language policy (Qwen2.5-VL): its tower, whose features
//! replace a prompt's image tokens, and the M-RoPE positions (temporal, row, column) its
//! language model — a Qwen2 decoder otherwise — turns queries and keys by.
//!
//! A prompt's image tokens and positions are checked against its images once, when a
//! request comes in ([`ImagePrompt`]); the sampler and the scorer then read the same
//! features and positions, so an image never expands differently in one than the other.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::Path;
use std::rc::Rc;

use serde_json::Value;
use tch::{Device, Kind, Tensor};

use super::super::config::ModelConfig;
use super::super::decoder::{CacheStep, Pass};
use super::super::language_model::LanguageModel;
use super::super::lora::Route;
use super::super::weights::SafetensorsSet;
use super::super::{Error, LoadOptions, Result};
use super::layout::{self, Grid};
use super::processor::{Image, ImageProcessor};
use super::qwen2_5_vl::{VisionConfig, VisionTower};

/// What a `config.json` says of a vision-language model beyond its language model.
pub(crate) struct VisionParts {
    /// The whole `config.json`, which a saved checkpoint writes back.
    raw: Value,
    config: VisionConfig,
    image_token: i64,
    mrope_section: Vec<i64>,
}

/// The vision tower of a loaded policy and how its language model places images.
pub(crate) struct Vision {
    raw: Value,
    tower: VisionTower,
    processor: ImageProcessor,
    image_token: i64,
    mrope_section: Vec<i64>,
}

/// A `qwen2_5_vl` folder's language-model config and vision parts; `None` for any other
/// model type (a text model, read as before).
pub(crate) fn read_config(dir: &Path) -> Result<Option<(ModelConfig, VisionParts)>> {
    let file = dir.join("config.json");
    let bad = |reason: String| Error::Config { file: file.clone(), reason };
    let text = std::fs::read_to_string(&file).map_err(|source| Error::io(&file, source))?;
    let raw: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    if raw["model_type"] != "qwen2_5_vl" {
        return Ok(None);
    }
    let mut text_config = raw["text_config"].clone();
    let mrope_section: Vec<i64> = serde_json::from_value(text_config["rope_parameters"]["mrope_section"].clone())
        .map_err(|e| bad(format!("text_config.rope_parameters.mrope_section: {e}")))?;
    // The language model is a Qwen2 decoder; only its positions differ.
    text_config["model_type"] = "qwen2".into();
    let mut config = ModelConfig::from_json(&text_config.to_string()).map_err(|e| bad(format!("text_config: {e}")))?;
    config.add_generation_eos(dir)?;
    if mrope_section.iter().sum::<i64>() * 2 != config.head_dim as i64 {
        return Err(bad(format!(
            "mrope_section {mrope_section:?} does not sum to half the head dim {}",
            config.head_dim
        )));
    }
    let vision: VisionConfig =
        serde_json::from_value(raw["vision_config"].clone()).map_err(|e| bad(format!("vision_config: {e}")))?;
    let image_token = raw["image_token_id"].as_i64().ok_or_else(|| bad("missing key `image_token_id`".into()))?;
    Ok(Some((config, VisionParts { raw, config: vision, image_token, mrope_section })))
}

impl Vision {
    /// The tower from `files`, the image processor from `dir/preprocessor_config.json`.
    pub(crate) fn load(
        dir: &Path,
        parts: VisionParts,
        files: &SafetensorsSet,
        options: &LoadOptions,
    ) -> Result<Vision> {
        let tower = VisionTower::load(parts.config, files, options.kind(), options.tch_device())?;
        let processor = ImageProcessor::from_dir(dir)?;
        let (image_token, mrope_section) = (parts.image_token, parts.mrope_section);
        Ok(Vision { raw: parts.raw, tower, processor, image_token, mrope_section })
    }

    /// What a saved checkpoint writes beside the language model's tensors: the whole
    /// `config.json` and the tower's tensors.
    pub(crate) fn checkpoint_parts(&self) -> (&Value, &[(String, Tensor)]) {
        (&self.raw, self.tower.named_tensors())
    }

    /// Whether a checkpoint tensor is the tower's (the language model's check skips it).
    pub(crate) fn owns(name: &str) -> bool {
        name.starts_with("visual.")
    }
}

/// The images of one prompt, as the image processor makes them: every image's patches
/// and its patch grid.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptImages {
    /// Names the images (their digests): prompts share prefill work only with the same key.
    pub key: String,
    /// (patches, patch values), row-major, image after image.
    pub pixel_values: Vec<f32>,
    pub grids: Vec<Grid>,
}

impl PromptImages {
    fn pixel_tensor(&self, device: Device) -> Tensor {
        let patches: usize = self.grids.iter().map(Grid::patches).sum();
        Tensor::from_slice(&self.pixel_values).to_device(device).view([patches as i64, -1])
    }
}

/// Image features to put in row `row` of a batch, at columns `offsets`.
pub(crate) struct RowImages {
    pub(crate) row: i64,
    pub(crate) offsets: Vec<i64>,
    pub(crate) features: Tensor,
}

/// A prompt's images as its language model sees them, settled once per request.
#[derive(Debug)]
pub(crate) struct ImagePrompt {
    /// (image tokens, E): the tower's features, in the order the prompt's image tokens come.
    features: Tensor,
    /// Which prompt tokens are image tokens.
    is_image: Vec<bool>,
    /// M-RoPE positions of every prompt token.
    positions: [Vec<i64>; 3],
    /// What a generated token's position adds to its column: images take fewer positions
    /// than tokens, so text after them counts on from the largest position.
    delta: i64,
}

impl ImagePrompt {
    /// Positions of tokens `start..start + len` on each axis; past the prompt's end (the
    /// padding of a prefill row) they count on as generated tokens do.
    pub(crate) fn positions(&self, start: usize, len: usize) -> [Vec<i64>; 3] {
        std::array::from_fn(|axis| (start..start + len).map(|i| self.position(axis, i)).collect())
    }

    /// Token i's position on `axis`: the prompt's own, or after it as generated tokens.
    pub(crate) fn position(&self, axis: usize, i: usize) -> i64 {
        self.positions[axis].get(i).copied().unwrap_or(i as i64 + self.delta)
    }

    pub(crate) fn delta(&self) -> i64 {
        self.delta
    }

    /// The image tokens among prompt tokens `start..end`, as batch row `row` holds them
    /// from column 0: their columns and features.
    pub(crate) fn features_in(&self, row: i64, start: usize, end: usize) -> RowImages {
        let before = self.is_image[..start].iter().filter(|&&b| b).count() as i64;
        let offsets: Vec<i64> = (start..end).filter(|&i| self.is_image[i]).map(|i| (i - start) as i64).collect();
        let features = self.features.narrow(0, before, offsets.len() as i64);
        RowImages { row, offsets, features }
    }
}

impl LanguageModel {
    /// The token each image block expands into, for a vision-language model.
    pub fn image_token(&self) -> Option<i64> {
        self.vision.as_ref().map(|v| v.image_token)
    }

    /// Refuses a prompt of a vision-language model that holds image tokens but comes
    /// without its images: embedded as text, it would be silently another prompt.
    fn check_no_images(&self, ids: &[i64]) -> Result<()> {
        let Some(token) = self.image_token() else { return Ok(()) };
        match ids.iter().filter(|&&id| id == token).count() {
            0 => Ok(()),
            n => Err(Error::Request { reason: format!("a prompt holds {n} image tokens ({token}) but no images") }),
        }
    }

    /// A prompt whose image placeholders (one `image_token` per image, as the chat template
    /// renders them) stand for `images`, in order: the ids with each placeholder expanded
    /// into its image's tokens, and the images as the tower takes them. This is the one
    /// place a prompt's images are expanded; everything after reads these ids.
    pub fn prompt_with_images(&self, ids: &[i64], images: &[Image]) -> Result<(Vec<i64>, PromptImages)> {
        let vision = self.vision.as_ref().ok_or_else(|| Error::Request {
            reason: format!("{} images given, but the model has no vision tower", images.len()),
        })?;
        let request = |reason: String| Error::Request { reason };
        let processed = vision.processor.process(images).map_err(request)?;
        let merge = vision.tower.config().spatial_merge_size;
        let ids = layout::expand_image_tokens(ids, vision.image_token, &processed.grids, merge).map_err(request)?;
        Ok((ids, processed))
    }

    /// Each prompt's [`ImagePrompt`], checked and computed once per distinct prompt and
    /// images, before any forward runs; a prompt without images must hold no image tokens.
    pub(crate) fn image_prompts<'a>(
        &self,
        prompts: impl Iterator<Item = (&'a [i64], Option<&'a PromptImages>)>,
    ) -> Result<Vec<Option<Rc<ImagePrompt>>>> {
        let mut computed: HashMap<(&[i64], &str), Rc<ImagePrompt>> = HashMap::new();
        let mut out = Vec::new();
        for (ids, images) in prompts {
            let Some(images) = images else {
                self.check_no_images(ids)?;
                out.push(None);
                continue;
            };
            let prompt = match computed.entry((ids, images.key.as_str())) {
                Entry::Occupied(computed) => Rc::clone(computed.get()),
                Entry::Vacant(new) => Rc::clone(new.insert(Rc::new(self.image_prompt(ids, images)?))),
            };
            out.push(Some(prompt));
        }
        Ok(out)
    }

    /// Checks that `ids` expands `images` exactly (one run of image tokens per image, as
    /// long as its merged grid) and computes their features and positions.
    pub(crate) fn image_prompt(&self, ids: &[i64], images: &PromptImages) -> Result<ImagePrompt> {
        let vision = self.vision.as_ref().ok_or_else(|| Error::Request {
            reason: format!("a prompt holds images ({}), but the model has no vision tower", images.key),
        })?;
        let merge = vision.tower.config().spatial_merge_size;
        let positions = layout::rope_positions(ids, vision.image_token, &images.grids, merge)
            .map_err(|reason| Error::Request { reason: format!("images {}: {reason}", images.key) })?;
        let features = vision.tower.forward(&images.pixel_tensor(self.device()), &images.grids)?;
        let next = positions.iter().filter_map(|p| p.last()).max().map_or(0, |&p| p + 1);
        Ok(ImagePrompt {
            features: features.to_kind(self.kind()),
            is_image: ids.iter().map(|&id| id == vision.image_token).collect(),
            positions,
            delta: next - ids.len() as i64,
        })
    }

    /// cos and sin of rotary positions (3, B, L): M-RoPE's sections for a
    /// vision-language model; a text model's positions are the first axis.
    pub(crate) fn rope(&self, positions: &Tensor) -> (Tensor, Tensor) {
        let rotary = &self.lm.model.rotary;
        match &self.vision {
            Some(vision) => rotary.cos_sin_mrope(positions, &vision.mrope_section, self.kind()),
            None => rotary.cos_sin(&positions.get(0), self.kind()),
        }
    }

    /// Token embeddings of `ids` (B, L), with `images`' features in their rows and columns.
    pub(crate) fn embed_with_images(&self, ids: &Tensor, images: &[RowImages]) -> Tensor {
        let mut x = self.lm.embed(ids);
        for image in images.iter().filter(|i| !i.offsets.is_empty()) {
            let columns = Tensor::from_slice(&image.offsets).to_device(x.device());
            let rows = Tensor::full([image.offsets.len() as i64], image.row, (Kind::Int64, x.device()));
            let _ = x.index_put_(&[Some(rows), Some(columns)], &image.features, false);
        }
        x
    }

    /// Logits (L, V), float32, of every position of a whole prompt holding `images`,
    /// without a cache.
    pub fn image_prompt_logits(&mut self, ids: &[i64], images: &PromptImages) -> Result<Tensor> {
        let prompt = self.image_prompt(ids, images)?;
        let device = self.device();
        let embeddings = self.embed_with_images(&ids_row(ids, device), &[prompt.features_in(0, 0, ids.len())]);
        let positions = prompt.positions(0, ids.len()).concat();
        let (cos, sin) = self.rope(&Tensor::from_slice(&positions).to_device(device).reshape([3, 1, -1]));
        let route = Route::new(&[None], device, None);
        let pass = Pass { cos, sin, mask: None, causal: true, cache: CacheStep::None, route: &route, packed: false };
        let hidden = self.lm.hidden_of_embeddings(embeddings, &pass);
        Ok(self.lm.head(&hidden.squeeze_dim(0)).to_kind(Kind::Float))
    }
}

fn ids_row(ids: &[i64], device: Device) -> Tensor {
    Tensor::from_slice(ids).to_device(device).unsqueeze(0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tch::Kind;
    use tch::nn::OptimizerConfig;

    use super::super::fixture::{gap_and_scale, grids, images, policy, processor_case, reference};
    use crate::model::{
        GenerationRequest, GenerationSettings, LanguageModel, LoadOptions, LoraConfig, MicroBatching, PromptImages,
        Sampling, SaveAs, ScoreRequest,
    };

    #[test]
    fn a_prompt_with_two_images_gets_transformers_logits() {
        let mut model = policy();
        let ids = Vec::<i64>::try_from(reference("input_ids")).unwrap();
        let logits = tch::no_grad(|| model.image_prompt_logits(&ids, &images())).unwrap();
        let expected = reference("logits");
        let (gap, scale) = gap_and_scale(&logits, &expected);
        assert!(gap < 1e-5 * scale, "largest gap to transformers' logits: {gap} (largest logit {scale})");
        // One image token short: an error naming the image, not a silently shifted prompt.
        let first = ids.iter().position(|&id| Some(id) == model.image_token()).unwrap();
        let short = [&ids[..first], &ids[first + 1..]].concat();
        let error = model.image_prompt_logits(&short, &images()).unwrap_err();
        assert!(error.to_string().contains("expands into 15 tokens, but the prompt holds 14"), "{error}");
    }

    #[test]
    fn a_prompts_image_placeholders_expand_once_into_what_the_sampler_and_trainer_read() {
        let mut model = policy();
        let (image, pixel_values, grid) = processor_case(0);
        let (ids, images) = model.prompt_with_images(&[5, 250, 40], std::slice::from_ref(&image)).unwrap();
        assert_eq!(ids, [vec![5], vec![250; 6], vec![40]].concat(), "a 4 x 6 grid is 6 tokens");
        assert_eq!(images.grids, [grid]);
        let ours = tch::Tensor::from_slice(&images.pixel_values).view_as(&pixel_values);
        assert!(gap_and_scale(&ours, &pixel_values).0 < 1e-4, "the processor's pixel values");
        let settings = GenerationSettings::new(Sampling::Greedy, 3);
        let request =
            GenerationRequest { prompt_ids: ids.clone(), seed: 0, adapter: None, images: Some(Arc::new(images)) };
        assert_eq!(model.generate(&[request], &settings).unwrap()[0].token_ids.len(), 3);
        let error = model.prompt_with_images(&[5, 250, 250], std::slice::from_ref(&image)).unwrap_err();
        assert!(error.to_string().contains("2 image placeholders for 1 images"), "{error}");
    }

    #[test]
    fn in_bfloat16_the_tower_and_the_language_model_give_transformers_logits_to_its_precision() {
        let options = LoadOptions { dtype: Some(crate::model::DType::Bf16), ..LoadOptions::default() };
        let mut model = LanguageModel::load(&super::super::fixture::fixture(), &options).unwrap();
        let ids = Vec::<i64>::try_from(reference("input_ids")).unwrap();
        let logits = tch::no_grad(|| model.image_prompt_logits(&ids, &images())).unwrap();
        let expected = reference("logits");
        let (gap, scale) = gap_and_scale(&logits, &expected);
        assert!(gap < 2e-2 * scale, "largest gap to transformers' float32 logits: {gap} (largest logit {scale})");
    }

    #[test]
    fn the_sampler_continues_a_prompt_with_images_as_transformers_greedy_does() {
        let mut model = policy();
        let ids = Vec::<i64>::try_from(reference("input_ids")).unwrap();
        let expected = Vec::<i64>::try_from(reference("greedy_ids")).unwrap();
        let with_images =
            |seed| GenerationRequest { prompt_ids: ids.clone(), seed, adapter: None, images: Some(images()) };
        // Two branches of the image prompt (one prefill, its cache copied), beside a
        // text-only prompt of other length in the same batch.
        let text = GenerationRequest { prompt_ids: vec![5, 17, 33, 40], seed: 0, adapter: None, images: None };
        let mut settings = GenerationSettings::new(Sampling::Greedy, expected.len());
        settings.eos_token_ids = Some(vec![]);
        let out = model.generate(&[with_images(0), text.clone(), with_images(1)], &settings).unwrap();
        assert_eq!(out[0].token_ids, expected, "greedy ids after the images");
        assert_eq!(out[2].token_ids, expected);
        // Each sampled token's logprob is what a whole forward over prompt and reply gives
        // it: the cache and the positions after the images (the prompt's delta) agree.
        let whole = [ids.clone(), expected.clone()].concat();
        let logits = tch::no_grad(|| model.image_prompt_logits(&whole[..whole.len() - 1], &images())).unwrap();
        let logprobs = logits.narrow(0, ids.len() as i64 - 1, expected.len() as i64).log_softmax(-1, Kind::Float);
        for (step, (&token, &sampled)) in expected.iter().zip(&out[0].logprobs).enumerate() {
            let whole = logprobs.double_value(&[step as i64, token]);
            assert!((whole - f64::from(sampled)).abs() < 1e-4, "step {step}: sampled {sampled}, whole {whole}");
        }
        // The text prompt is continued as if alone.
        let alone = model.generate(&[text], &settings).unwrap();
        assert_eq!(out[1].token_ids, alone[0].token_ids);
        // The same ids without their images are refused, not read as text.
        let mut blind = with_images(0);
        let first: Vec<f32> = Vec::try_from(reference("pixel_values").narrow(0, 0, 60).reshape([-1])).unwrap();
        blind.images =
            Some(Arc::new(PromptImages { key: "one".into(), pixel_values: first, grids: grids()[..1].to_vec() }));
        let error = model.generate(&[blind], &settings).unwrap_err();
        assert!(error.to_string().contains("the prompt holds more images than the 1 given"), "{error}");
        let error = model.generate(&[GenerationRequest { images: None, ..with_images(0) }], &settings).unwrap_err();
        assert!(error.to_string().contains("image tokens (250) but no images"), "{error}");
    }

    #[test]
    fn the_trainer_scores_sampled_replies_to_a_prompt_with_images_as_the_sampler_drew_them() {
        let mut model = policy();
        let ids = Vec::<i64>::try_from(reference("input_ids")).unwrap();
        let sampling = Sampling::Sample { temperature: 1.0, top_k: 0, top_p: 1.0 };
        let mut settings = GenerationSettings::new(sampling, 6);
        settings.eos_token_ids = Some(vec![]);
        let request = |seed| GenerationRequest { prompt_ids: ids.clone(), seed, adapter: None, images: Some(images()) };
        let sampled = model.generate(&[request(0), request(1), request(2)], &settings).unwrap();
        let requests: Vec<ScoreRequest> = sampled
            .iter()
            .map(|g| ScoreRequest {
                prompt_ids: ids.clone(),
                response_ids: g.token_ids.clone(),
                adapter: None,
                images: Some(images()),
            })
            .collect();
        // Shared prompt rows or one row each, activations kept or recomputed: the
        // trainer's logprobs are the sampler's.
        for (share_prefix, recompute) in [(true, false), (false, true)] {
            let batching = MicroBatching { share_prefix, ..MicroBatching::new(4096, recompute) };
            let scored = model.backward(&requests, &batching, 0, &mut |mb| Ok(mb.logprobs.sum(Kind::Float) * 0.0));
            for (g, scored) in sampled.iter().zip(scored.unwrap()) {
                for (step, (s, t)) in g.logprobs.iter().zip(&scored).enumerate() {
                    assert!((s - t).abs() < 1e-4, "share {share_prefix}, step {step}: sampled {s}, scored {t}");
                }
            }
        }
        // Scored without its images, the same ids are refused.
        let blind = ScoreRequest { images: None, ..requests[0].clone() };
        let other = ScoreRequest { images: Some(images()), ..blind.clone() };
        assert!(model.score(&[other], 4096).is_ok());
        let error = model.score(&[blind], 4096).unwrap_err();
        assert!(error.to_string().contains("holds 23 image tokens (250) but no images"), "{error}");
    }

    #[test]
    fn a_lora_adapter_trains_the_language_model_and_a_saved_model_keeps_its_tower() {
        let mut model = policy();
        let ids = Vec::<i64>::try_from(reference("input_ids")).unwrap();
        let before = tch::no_grad(|| model.image_prompt_logits(&ids, &images())).unwrap();
        model.add_adapter("a", &LoraConfig { rank: 4, ..LoraConfig::default() }, 3).unwrap();
        let request = ScoreRequest {
            prompt_ids: ids.clone(),
            response_ids: vec![7, 8],
            adapter: Some("a".into()),
            images: Some(images()),
        };
        let mut optimizer = tch::nn::AdamW::default().build(model.adapter_var_store("a").unwrap(), 1e-2).unwrap();
        let batching = MicroBatching::new(4096, false);
        model
            .backward(std::slice::from_ref(&request), &batching, 0, &mut |mb| Ok(-mb.logprobs.sum(Kind::Float)))
            .unwrap();
        optimizer.step();
        // The adapter moved the language model; the sampler and the trainer agree through it.
        let settings = GenerationSettings::new(Sampling::Sample { temperature: 1.0, top_k: 0, top_p: 1.0 }, 4);
        let sampled = model
            .generate(
                &[GenerationRequest {
                    prompt_ids: ids.clone(),
                    seed: 5,
                    adapter: Some("a".into()),
                    images: Some(images()),
                }],
                &settings,
            )
            .unwrap();
        let scored = model
            .score(&[ScoreRequest { response_ids: sampled[0].token_ids.clone(), ..request.clone() }], 4096)
            .unwrap();
        assert!(scored[0].iter().zip(&sampled[0].logprobs).all(|(a, b)| (a - b).abs() < 1e-4));
        let base = model.score(&[ScoreRequest { adapter: None, ..request.clone() }], 4096).unwrap();
        let adapted = model.score(std::slice::from_ref(&request), 4096).unwrap();
        assert!((adapted[0][0] - base[0][0]).abs() > 1e-3, "the adapter trained: {adapted:?} against {base:?}");
        // A saved model is a whole Qwen2.5-VL folder: loaded back, the same logits.
        let dir = tempfile::tempdir().unwrap();
        model.save(dir.path(), &SaveAs { policy: "p", version: 1, parent: None }).unwrap();
        let mut loaded = LanguageModel::load(dir.path(), &LoadOptions::default()).unwrap();
        let after = tch::no_grad(|| loaded.image_prompt_logits(&ids, &images())).unwrap();
        assert!(after.allclose(&before, 1e-6, 1e-6, false), "the saved model's logits");
    }
}
