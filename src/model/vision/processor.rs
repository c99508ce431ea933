//! Qwen2-VL's image processor, as transformers' torchvision backend runs it: each image
//! resized (bicubic, antialiased) to the nearest size in multiples of patch x merge whose
//! area lies within the processor's bounds, rescaled and normalised, and cut into patches
//! in merge-block order, each patch repeated over the temporal patch size.

use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tch::{Device, Kind, Tensor};

use super::super::Error;
use super::layout::Grid;
use super::model::PromptImages;

/// An RGB image, 8 bits a channel, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub width: usize,
    pub height: usize,
    pub rgb: Vec<u8>,
}

impl Image {
    /// An image of `width` x `height` from its RGB bytes; an error when they do not fit.
    pub fn new(width: usize, height: usize, rgb: Vec<u8>) -> Result<Image, String> {
        if rgb.len() != width * height * 3 || width == 0 || height == 0 {
            return Err(format!("{} bytes are not an RGB image of {width} x {height}", rgb.len()));
        }
        Ok(Image { width, height, rgb })
    }

    /// Decodes a PNG of any colour type and bit depth into 8-bit RGB (alpha dropped).
    pub fn from_png(bytes: &[u8]) -> Result<Image, String> {
        let mut decoder = png::Decoder::new(bytes);
        decoder.set_transformations(png::Transformations::normalize_to_color8());
        let mut reader = decoder.read_info().map_err(|e| format!("not a PNG image: {e}"))?;
        let mut buffer = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buffer).map_err(|e| format!("a PNG image that does not decode: {e}"))?;
        let pixels = &buffer[..info.buffer_size()];
        let rgb = match info.color_type {
            png::ColorType::Rgb => pixels.to_vec(),
            png::ColorType::Rgba => pixels.chunks(4).flat_map(|p| [p[0], p[1], p[2]]).collect(),
            png::ColorType::Grayscale => pixels.iter().flat_map(|&g| [g, g, g]).collect(),
            png::ColorType::GrayscaleAlpha => pixels.chunks(2).flat_map(|p| [p[0], p[0], p[0]]).collect(),
            png::ColorType::Indexed => return Err("a PNG palette image was not expanded".into()),
        };
        Image::new(info.width as usize, info.height as usize, rgb)
    }

    /// The image as an 8-bit RGB PNG: what the store keeps, the same bytes for the same pixels.
    pub fn to_png(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut encoder = png::Encoder::new(&mut bytes, self.width as u32, self.height as u32);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().expect("a PNG header writes to memory");
        writer.write_image_data(&self.rgb).expect("RGB bytes of the image's size");
        writer.finish().expect("a PNG writes to memory");
        bytes
    }

    /// The sha256 of the image's PNG, in hex: its name in the store.
    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(self.to_png()))
    }
}

/// `preprocessor_config.json` of a Qwen2-VL-family image processor.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ImageProcessor {
    #[serde(default = "fourteen")]
    pub patch_size: usize,
    #[serde(default = "two")]
    pub merge_size: usize,
    #[serde(default = "two")]
    pub temporal_patch_size: usize,
    pub image_mean: [f64; 3],
    pub image_std: [f64; 3],
    /// Area bounds in pixels: `size.shortest_edge`/`longest_edge` (transformers ≥ 4.50),
    /// or the older `min_pixels`/`max_pixels`.
    #[serde(default)]
    size: Option<AreaBounds>,
    #[serde(default)]
    min_pixels: Option<usize>,
    #[serde(default)]
    max_pixels: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
struct AreaBounds {
    shortest_edge: usize,
    longest_edge: usize,
}

fn fourteen() -> usize {
    14
}

fn two() -> usize {
    2
}

impl ImageProcessor {
    /// Reads `dir/preprocessor_config.json`.
    pub fn from_dir(dir: &Path) -> Result<ImageProcessor, Error> {
        let file = dir.join("preprocessor_config.json");
        let text = std::fs::read_to_string(&file).map_err(|source| Error::io(&file, source))?;
        let processor: ImageProcessor =
            serde_json::from_str(&text).map_err(|e| Error::Config { file: file.clone(), reason: e.to_string() })?;
        processor.bounds().map_err(|reason| Error::Config { file, reason })?;
        Ok(processor)
    }

    /// (min, max) pixels of a resized image.
    fn bounds(&self) -> Result<(usize, usize), String> {
        match (&self.size, self.min_pixels, self.max_pixels) {
            (Some(size), _, _) => Ok((size.shortest_edge, size.longest_edge)),
            (None, Some(min), Some(max)) => Ok((min, max)),
            _ => {
                Err("no pixel bounds: expected `size: {shortest_edge, longest_edge}` or `min_pixels` and `max_pixels`"
                    .into())
            }
        }
    }

    /// The size (height, width) an image is resized to: multiples of patch x merge,
    /// nearest the original, scaled down or up (keeping the aspect ratio) to the bounds.
    pub fn resized(&self, height: usize, width: usize) -> Result<(usize, usize), String> {
        let (min, max) = self.bounds()?;
        let factor = (self.patch_size * self.merge_size) as f64;
        let (h, w) = (height as f64, width as f64);
        if h.max(w) / h.min(w) > 200.0 {
            return Err(format!("an image of {width} x {height} is more than 200 times longer than wide"));
        }
        let round = |x: f64| (x / factor).round_ties_even() * factor;
        let (mut h_bar, mut w_bar) = (round(h), round(w));
        if h_bar * w_bar > max as f64 {
            let beta = (h * w / max as f64).sqrt();
            h_bar = factor.max((h / beta / factor).floor() * factor);
            w_bar = factor.max((w / beta / factor).floor() * factor);
        } else if h_bar * w_bar < min as f64 {
            let beta = (min as f64 / (h * w)).sqrt();
            h_bar = (h * beta / factor).ceil() * factor;
            w_bar = (w * beta / factor).ceil() * factor;
        }
        Ok((h_bar as usize, w_bar as usize))
    }

    /// The images of one prompt, in order, as the vision tower takes them, named by
    /// their digests.
    pub fn process(&self, images: &[Image]) -> Result<PromptImages, String> {
        let mut pixel_values = Vec::new();
        let mut grids = Vec::with_capacity(images.len());
        for image in images {
            let (patches, grid) = self.patches(image)?;
            pixel_values.extend(Vec::<f32>::try_from(patches.reshape([-1])).expect("float32 patches"));
            grids.push(grid);
        }
        let key = images.iter().map(Image::digest).collect::<Vec<_>>().join(",");
        Ok(PromptImages { key, pixel_values, grids })
    }

    /// One image's patches (patches, patch values) and grid.
    fn patches(&self, image: &Image) -> Result<(Tensor, Grid), String> {
        let (height, width) = self.resized(image.height, image.width)?;
        let pixels = Tensor::from_slice(&image.rgb).view([image.height as i64, image.width as i64, 3]);
        let mut x = pixels.permute([2, 0, 1]).unsqueeze(0);
        if (height, width) != (image.height, image.width) {
            // torchvision resizes uint8 images with libtorch's own uint8 kernel.
            x = x.internal_upsample_bicubic2d_aa([height as i64, width as i64], false, None, None);
        }
        let x = x.to_kind(Kind::Float);
        let mean = Tensor::from_slice(&self.image_mean.map(|m| (m * 255.0) as f32)).view([1, 3, 1, 1]);
        let std = Tensor::from_slice(&self.image_std.map(|s| (s * 255.0) as f32)).view([1, 3, 1, 1]);
        let x = (x - mean) / std;
        let (p, m, t) = (self.patch_size as i64, self.merge_size as i64, self.temporal_patch_size as i64);
        let (gh, gw) = (height as i64 / p, width as i64 / p);
        let x = x.reshape([1, 3, gh / m, m, p, gw / m, m, p]).permute([0, 2, 5, 3, 6, 1, 4, 7]);
        let x = x.unsqueeze(6).expand([-1, -1, -1, -1, -1, -1, t, -1, -1], false).reshape([gh * gw, 3 * t * p * p]);
        Ok((x.to_device(Device::Cpu), Grid { t: 1, h: gh as usize, w: gw as usize }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::{fixture, gap_and_scale, processor_case};
    use super::*;

    #[test]
    fn images_are_resized_normalised_and_cut_into_patches_as_transformers_does() {
        let processor = ImageProcessor::from_dir(&fixture()).unwrap();
        for i in 0..3 {
            let (image, expected, grid) = processor_case(i);
            let (width, height) = (image.width, image.height);
            let processed = processor.process(std::slice::from_ref(&image)).unwrap();
            assert_eq!(processed.grids, [grid], "image {i}");
            let ours = Tensor::from_slice(&processed.pixel_values).view_as(&expected);
            let gap = gap_and_scale(&ours, &expected).0;
            assert!(gap < 1e-4, "image {i} of {width} x {height}: largest gap {gap}");
            // The PNG the store keeps decodes to the same pixels, and names them.
            let png = image.to_png();
            assert_eq!(Image::from_png(&png).unwrap(), image);
            assert_eq!(processed.key, image.digest());
        }
    }

    #[test]
    fn sizes_keep_to_multiples_of_the_merged_patch_within_the_area_bounds() {
        let processor: ImageProcessor = serde_json::from_str(
            r#"{"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "min_pixels": 784, "max_pixels": 40000}"#,
        )
        .unwrap();
        assert_eq!(processor.resized(84, 140), Ok((84, 140)));
        assert_eq!(processor.resized(50, 73), Ok((56, 84)));
        assert_eq!(processor.resized(300, 170), Ok((252, 140)));
        assert_eq!(processor.resized(20, 31), Ok((28, 28)));
        assert!(processor.resized(1, 300).unwrap_err().contains("more than 200 times"));
        assert!(Image::from_png(b"not a png").unwrap_err().contains("not a PNG"));
        assert!(Image::new(2, 2, vec![0; 11]).unwrap_err().contains("11 bytes"));
    }
}
