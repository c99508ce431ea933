//! Qwen2.5-VL's vision tower in tch: patches embedded by a linear map (the checkpoint's
//! Conv3d, whose stride is its kernel), a ViT of RMSNorm blocks with 2-D rotary
//! attention, inside windows except in the full-attention blocks, and a merger that
//! maps each merge x merge block of patches to one language-model embedding.

use std::cell::RefCell;

use serde::Deserialize;
use tch::{Device, Kind, Tensor};

use super::super::Error;
use super::super::decoder::{RmsNorm, apply_rotary};
use super::super::weights::SafetensorsSet;
use super::layout::{self, Grid};

/// `vision_config` of a Qwen2.5-VL `config.json`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct VisionConfig {
    pub depth: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_heads: usize,
    #[serde(default = "three")]
    pub in_channels: usize,
    pub patch_size: usize,
    pub spatial_merge_size: usize,
    pub temporal_patch_size: usize,
    pub window_size: usize,
    pub out_hidden_size: usize,
    pub fullatt_block_indexes: Vec<usize>,
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RopeParameters {
    pub rope_theta: f64,
}

fn three() -> usize {
    3
}

impl VisionConfig {
    fn head_dim(&self) -> i64 {
        (self.hidden_size / self.num_heads) as i64
    }

    /// Values one patch carries: channels x frames x rows x columns of pixels.
    pub fn patch_values(&self) -> i64 {
        (self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size) as i64
    }

    /// A window's side in merge blocks.
    fn window_blocks(&self) -> usize {
        self.window_size / self.spatial_merge_size / self.patch_size
    }
}

#[derive(Debug)]
struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> Tensor {
        x.linear(&self.weight, self.bias.as_ref())
    }
}

#[derive(Debug)]
struct Block {
    norm1: RmsNorm,
    qkv: Linear,
    proj: Linear,
    norm2: RmsNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

/// The vision tower of a Qwen2.5-VL checkpoint (`visual.*`).
#[derive(Debug)]
pub struct VisionTower {
    config: VisionConfig,
    /// The patch embedding as a (hidden, patch values) matrix.
    patch_embed: Tensor,
    blocks: Vec<Block>,
    merger_norm: RmsNorm,
    merger_in: Linear,
    merger_out: Linear,
    /// Every tensor as the checkpoint names and shapes it, for a save.
    named: Vec<(String, Tensor)>,
}

/// Reads the tower's tensors of a checkpoint, each of a known shape, keeping their names.
struct Reader<'a> {
    weights: &'a SafetensorsSet,
    kind: Kind,
    device: Device,
    read: RefCell<Vec<(String, Tensor)>>,
}

impl Reader<'_> {
    fn tensor(&self, name: &str, shape: &[i64]) -> Result<Tensor, Error> {
        let tensor = self.weights.tensor(name, shape, self.kind, self.device)?;
        self.read.borrow_mut().push((name.to_owned(), tensor.shallow_clone()));
        Ok(tensor)
    }

    fn norm(&self, name: &str, dim: i64) -> Result<RmsNorm, Error> {
        Ok(RmsNorm::of_weight(self.tensor(&format!("{name}.weight"), &[dim])?, 1e-6))
    }

    fn linear(&self, name: &str, input: i64, output: i64) -> Result<Linear, Error> {
        let weight = self.tensor(&format!("{name}.weight"), &[output, input])?;
        let bias = Some(self.tensor(&format!("{name}.bias"), &[output])?);
        Ok(Linear { weight, bias })
    }
}

impl VisionTower {
    /// The tower's weights from `weights` (names `visual.…`), in `kind` on `device`.
    pub fn load(config: VisionConfig, weights: &SafetensorsSet, kind: Kind, device: Device) -> Result<Self, Error> {
        let read = Reader { weights, kind, device, read: RefCell::default() };
        let (hidden, inner) = (config.hidden_size as i64, config.intermediate_size as i64);
        let (t, p) = (config.temporal_patch_size as i64, config.patch_size as i64);
        let conv = read.tensor("visual.patch_embed.proj.weight", &[hidden, config.in_channels as i64, t, p, p])?;
        let mut blocks = Vec::with_capacity(config.depth);
        for i in 0..config.depth {
            let at = |part: &str| format!("visual.blocks.{i}.{part}");
            blocks.push(Block {
                norm1: read.norm(&at("norm1"), hidden)?,
                qkv: read.linear(&at("attn.qkv"), hidden, 3 * hidden)?,
                proj: read.linear(&at("attn.proj"), hidden, hidden)?,
                norm2: read.norm(&at("norm2"), hidden)?,
                gate_proj: read.linear(&at("mlp.gate_proj"), hidden, inner)?,
                up_proj: read.linear(&at("mlp.up_proj"), hidden, inner)?,
                down_proj: read.linear(&at("mlp.down_proj"), inner, hidden)?,
            });
        }
        let merged = hidden * (config.spatial_merge_size * config.spatial_merge_size) as i64;
        Ok(VisionTower {
            patch_embed: conv.reshape([hidden, -1]),
            blocks,
            merger_norm: read.norm("visual.merger.ln_q", hidden)?,
            merger_in: read.linear("visual.merger.mlp.0", merged, merged)?,
            merger_out: read.linear("visual.merger.mlp.2", merged, config.out_hidden_size as i64)?,
            named: read.read.take(),
            config,
        })
    }

    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// The tower's tensors under their checkpoint names (`visual.…`).
    pub fn named_tensors(&self) -> &[(String, Tensor)] {
        &self.named
    }

    /// The language-model embeddings of the images whose patches `pixel_values` holds
    /// (patches x patch values, in the processor's order), one per merge block: (tokens,
    /// out_hidden_size), image after image.
    pub fn forward(&self, pixel_values: &Tensor, grids: &[Grid]) -> Result<Tensor, Error> {
        let config = &self.config;
        let patches: usize = grids.iter().map(Grid::patches).sum();
        let expected = [patches as i64, config.patch_values()];
        if pixel_values.size() != expected {
            return Err(Error::Request {
                reason: format!("pixel values of shape {:?}, but the grids make {expected:?}", pixel_values.size()),
            });
        }
        let merge = config.spatial_merge_size;
        let unit = (merge * merge) as i64;
        let (order, window_bounds) = layout::windows(grids, merge, config.window_blocks());
        let order = Tensor::from_slice(&order).to_device(pixel_values.device());
        let in_windows = |x: Tensor| {
            let width = x.size()[1];
            x.reshape([-1, unit, width]).index_select(0, &order).reshape([-1, width])
        };
        let x = pixel_values.to_kind(self.patch_embed.kind()).linear::<Tensor>(&self.patch_embed, None);
        let mut x = in_windows(x);
        let (cos, sin) = self.rotary(grids, pixel_values.device());
        let (cos, sin) = (in_windows(cos), in_windows(sin));
        let windowed = block_diagonal(&window_bounds, x.device());
        let whole = block_diagonal(&layout::frames(grids), x.device());
        for (i, block) in self.blocks.iter().enumerate() {
            let mask = if config.fullatt_block_indexes.contains(&i) { &whole } else { &windowed };
            x = self.block(block, &x, &cos, &sin, mask);
        }
        let merged = self.merger_norm.forward(&x).reshape([-1, x.size()[1] * unit]);
        let merged = self.merger_out.forward(&self.merger_in.forward(&merged).gelu("none"));
        Ok(merged.index_select(0, &order.argsort(0, false)))
    }

    /// cos and sin of each patch's 2-D rotary angles, (patches, head_dim): the row's
    /// frequencies, then the column's, repeated over the head's two halves.
    fn rotary(&self, grids: &[Grid], device: Device) -> (Tensor, Tensor) {
        let half = self.config.head_dim() / 2;
        let theta = self.config.rope_parameters.as_ref().map_or(10_000.0, |r| r.rope_theta);
        let exponents = Tensor::arange_start_step(0, half, 2, (Kind::Float, device)) / half as f64;
        let inv_freq = Tensor::from(theta).to_device(device).pow(&exponents).reciprocal();
        let positions = layout::patch_positions(grids, self.config.spatial_merge_size);
        let flat: Vec<i64> = positions.iter().flat_map(|&(r, c)| [r, c]).collect();
        let positions = Tensor::from_slice(&flat).to_device(device).reshape([-1, 2]).to_kind(Kind::Float);
        let angles = positions.unsqueeze(-1) * inv_freq; // (patches, 2, half / 2)
        let angles = angles.reshape([-1, half]);
        let angles = Tensor::cat(&[&angles, &angles], -1);
        (angles.cos(), angles.sin())
    }

    fn block(&self, block: &Block, x: &Tensor, cos: &Tensor, sin: &Tensor, mask: &Tensor) -> Tensor {
        let x = x + self.attention(block, &block.norm1.forward(x), cos, sin, mask);
        let h = block.norm2.forward(&x);
        let mlp = block.down_proj.forward(&(block.gate_proj.forward(&h).silu() * block.up_proj.forward(&h)));
        x + mlp
    }

    fn attention(&self, block: &Block, x: &Tensor, cos: &Tensor, sin: &Tensor, mask: &Tensor) -> Tensor {
        let (len, heads, dim) = (x.size()[0], self.config.num_heads as i64, self.config.head_dim());
        let qkv = block.qkv.forward(x).reshape([len, 3, heads, dim]).permute([1, 2, 0, 3]); // (3, H, L, D)
        let (q, k, v) = (qkv.get(0), qkv.get(1), qkv.get(2));
        let (cos, sin) = (cos.unsqueeze(0), sin.unsqueeze(0));
        let rotate = |t: &Tensor| {
            let t32 = t.to_kind(Kind::Float);
            apply_rotary(&t32, &cos, &sin).to_kind(t.kind())
        };
        let (q, k) = (rotate(&q), rotate(&k));
        let out = Tensor::scaled_dot_product_attention(&q, &k, &v, Some(mask), 0.0, false, None, false);
        block.proj.forward(&out.permute([1, 0, 2]).reshape([len, heads * dim]))
    }
}

/// Boolean (L, L): true where a patch may attend another, both in one segment of `bounds`
/// (cumulative patch counts from 0).
fn block_diagonal(bounds: &[i64], device: Device) -> Tensor {
    let sizes: Vec<i64> = bounds.windows(2).map(|w| w[1] - w[0]).filter(|&n| n > 0).collect();
    let segment = Tensor::arange(sizes.len() as i64, (Kind::Int64, device)).repeat_interleave_self_tensor(
        &Tensor::from_slice(&sizes).to_device(device),
        0,
        None,
    );
    segment.unsqueeze(1).eq_tensor(&segment.unsqueeze(0))
}

#[cfg(test)]
mod tests {
    use super::super::fixture::{fixture, gap_and_scale, grids, reference};
    use super::*;

    fn tower() -> VisionTower {
        let text = std::fs::read_to_string(fixture().join("config.json")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let config: VisionConfig = serde_json::from_value(json["vision_config"].clone()).unwrap();
        let weights = SafetensorsSet::open_dir(&fixture()).unwrap();
        VisionTower::load(config, &weights, Kind::Float, Device::Cpu).unwrap()
    }

    #[test]
    fn the_tower_embeds_two_images_as_transformers_does() {
        let tower = tower();
        let features = tch::no_grad(|| tower.forward(&reference("pixel_values"), &grids())).unwrap();
        let expected = reference("image_features");
        assert_eq!(features.size(), expected.size());
        let (gap, scale) = gap_and_scale(&features, &expected);
        assert!(gap < 1e-5 * scale, "largest gap to transformers' features: {gap} (largest feature {scale})");
        let wrong = tower.forward(&reference("pixel_values").narrow(0, 0, 10), &grids()).unwrap_err();
        assert!(wrong.to_string().contains("but the grids make [92, 1176]"), "{wrong}");
    }

    #[test]
    fn the_prompts_m_rope_positions_are_transformers_own() {
        let ids = Vec::<i64>::try_from(reference("input_ids")).unwrap();
        let positions = layout::rope_positions(&ids, 250, &grids(), 2).unwrap();
        let expected = reference("position_ids");
        for (axis, row) in positions.iter().enumerate() {
            assert_eq!(row, &Vec::<i64>::try_from(expected.get(axis as i64)).unwrap(), "axis {axis}");
        }
    }
}
