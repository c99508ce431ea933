//! Where each image patch and each prompt token sits, as Qwen2.5-VL lays them out: pure
//! functions of the images' patch grids, computed once and shared by the vision tower,
//! the sampler and the trainer.
//!
//! ```text
//!  an image of 4 x 6 patches, merge 2: patches come in 2 x 2 blocks, block-major
//!   (0,0) (0,1) (1,0) (1,1) | (0,2) (0,3) (1,2) (1,3) | … → one prompt token per block
//!  windows: blocks grouped into w x w squares (w = window_size / merge / patch), row-major
//!  prompt:  text … <vision_start> [image tokens: (t, row, col) + offset] <vision_end> text …
//! ```

/// One image's patch grid: frames (1 for an image), rows and columns of patches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub t: usize,
    pub h: usize,
    pub w: usize,
}

impl Grid {
    pub fn patches(&self) -> usize {
        self.t * self.h * self.w
    }

    /// Prompt tokens the image expands into: one per merge x merge block of patches.
    pub fn tokens(&self, merge: usize) -> usize {
        self.patches() / (merge * merge)
    }
}

/// (row, column) of every patch of `grids`, in the order the image processor emits them:
/// merge x merge blocks, block-major, each frame repeating the image's positions.
pub fn patch_positions(grids: &[Grid], merge: usize) -> Vec<(i64, i64)> {
    let mut positions = Vec::new();
    for g in grids {
        let mut frame = Vec::with_capacity(g.h * g.w);
        for block_row in 0..g.h / merge {
            for block_col in 0..g.w / merge {
                for r in 0..merge {
                    for c in 0..merge {
                        frame.push(((block_row * merge + r) as i64, (block_col * merge + c) as i64));
                    }
                }
            }
        }
        for _ in 0..g.t {
            positions.extend_from_slice(&frame);
        }
    }
    positions
}

/// Windowed attention's order of the merge blocks (indices into block-major order), and
/// the cumulative patch count at each window's end (starting with 0). A window is `side`
/// x `side` blocks; windows run row-major, the last row and column cut short.
pub fn windows(grids: &[Grid], merge: usize, side: usize) -> (Vec<i64>, Vec<i64>) {
    let unit = (merge * merge) as i64;
    let (mut order, mut bounds) = (Vec::new(), vec![0i64]);
    let mut first = 0i64;
    for g in grids {
        let (rows, cols) = (g.h / merge, g.w / merge);
        for frame in 0..g.t {
            for window_row in (0..rows).step_by(side) {
                for window_col in (0..cols).step_by(side) {
                    let before = order.len();
                    for r in window_row..(window_row + side).min(rows) {
                        for c in window_col..(window_col + side).min(cols) {
                            order.push(first + ((frame * rows + r) * cols + c) as i64);
                        }
                    }
                    bounds.push(bounds.last().expect("starts with 0") + (order.len() - before) as i64 * unit);
                }
            }
        }
        first += (g.t * rows * cols) as i64;
    }
    (order, bounds)
}

/// The cumulative patch count at the end of each frame: full attention sees one frame.
pub fn frames(grids: &[Grid]) -> Vec<i64> {
    let mut bounds = vec![0i64];
    for g in grids {
        for _ in 0..g.t {
            bounds.push(bounds.last().expect("starts with 0") + (g.h * g.w) as i64);
        }
    }
    bounds
}

/// M-RoPE positions (temporal, row, column) of every token of a prompt: text counts on
/// from the previous token's largest position; each run of `image_token` ids is the next
/// image of `grids`, its tokens at (frame, row, column) of its merged grid, all offset by
/// where the image starts. An error names the run that does not match its grid.
pub fn rope_positions(ids: &[i64], image_token: i64, grids: &[Grid], merge: usize) -> Result<[Vec<i64>; 3], String> {
    let mut positions: [Vec<i64>; 3] = Default::default();
    let mut next = 0i64;
    let mut images = grids.iter();
    let mut i = 0;
    while i < ids.len() {
        if ids[i] != image_token {
            positions.iter_mut().for_each(|p| p.push(next));
            next += 1;
            i += 1;
            continue;
        }
        let run = ids[i..].iter().take_while(|&&id| id == image_token).count();
        let grid =
            images.next().ok_or_else(|| format!("the prompt holds more images than the {} given", grids.len()))?;
        if run != grid.tokens(merge) {
            return Err(format!(
                "an image of {} x {} patches expands into {} tokens, but the prompt holds {run} at position {i}",
                grid.h,
                grid.w,
                grid.tokens(merge)
            ));
        }
        let (rows, cols) = ((grid.h / merge) as i64, (grid.w / merge) as i64);
        for frame in 0..grid.t as i64 {
            for r in 0..rows {
                for c in 0..cols {
                    positions[0].push(next + frame);
                    positions[1].push(next + r);
                    positions[2].push(next + c);
                }
            }
        }
        next += rows.max(cols);
        i += run;
    }
    if images.next().is_some() {
        return Err(format!("{} images given, but the prompt holds fewer", grids.len()));
    }
    Ok(positions)
}

/// A prompt whose every `image_token` is one image's placeholder (as a chat template
/// renders it) with each placeholder repeated into the image's tokens: the ids the model
/// reads. An error when the placeholders and the images do not pair up.
pub fn expand_image_tokens(ids: &[i64], image_token: i64, grids: &[Grid], merge: usize) -> Result<Vec<i64>, String> {
    let placeholders = ids.iter().filter(|&&id| id == image_token).count();
    if placeholders != grids.len() {
        return Err(format!("the prompt has {placeholders} image placeholders for {} images", grids.len()));
    }
    let mut grids = grids.iter();
    let mut expanded = Vec::with_capacity(ids.len());
    for &id in ids {
        let copies = if id == image_token { grids.next().expect("as many as placeholders").tokens(merge) } else { 1 };
        expanded.extend(std::iter::repeat_n(id, copies));
    }
    Ok(expanded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_placeholder_becomes_its_images_tokens() {
        let grids = [Grid { t: 1, h: 4, w: 6 }, Grid { t: 1, h: 2, w: 2 }];
        assert_eq!(expand_image_tokens(&[1, 9, 2, 9], 9, &grids, 2).unwrap(), [1, 9, 9, 9, 9, 9, 9, 2, 9]);
        let wrong = expand_image_tokens(&[1, 9, 2], 9, &grids, 2).unwrap_err();
        assert!(wrong.contains("1 image placeholders for 2 images"), "{wrong}");
    }

    #[test]
    fn patches_come_in_merge_blocks_block_major() {
        let grid = Grid { t: 1, h: 2, w: 4 };
        let positions = patch_positions(&[grid], 2);
        assert_eq!(positions, [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]);
    }

    #[test]
    fn windows_run_row_major_and_the_last_ones_are_cut_short() {
        // 3 x 3 blocks in windows of 2 x 2 blocks: 4 windows of 4, 2, 2 and 1 blocks.
        let (order, bounds) = windows(&[Grid { t: 1, h: 6, w: 6 }], 2, 2);
        assert_eq!(order, [0, 1, 3, 4, 2, 5, 6, 7, 8]);
        assert_eq!(bounds, [0, 16, 24, 32, 36]);
        // A second image's blocks are numbered after the first's.
        let (order, bounds) = windows(&[Grid { t: 1, h: 2, w: 2 }, Grid { t: 1, h: 2, w: 4 }], 2, 2);
        assert_eq!((order, bounds), (vec![0, 1, 2], vec![0, 4, 12]));
    }

    #[test]
    fn image_tokens_take_their_grid_positions_and_text_goes_on_after_the_longer_side() {
        let grid = Grid { t: 1, h: 4, w: 6 };
        let ids = [1, 2, 9, 9, 9, 9, 9, 9, 3];
        let [t, h, w] = rope_positions(&ids, 9, &[grid], 2).unwrap();
        assert_eq!(t, [0, 1, 2, 2, 2, 2, 2, 2, 5]);
        assert_eq!(h, [0, 1, 2, 2, 2, 3, 3, 3, 5]);
        assert_eq!(w, [0, 1, 2, 3, 4, 2, 3, 4, 5]);
        let wrong = rope_positions(&ids[..7], 9, &[grid], 2).unwrap_err();
        assert!(wrong.contains("expands into 6 tokens, but the prompt holds 5"), "{wrong}");
        assert!(rope_positions(&[1, 2], 9, &[grid], 2).unwrap_err().contains("1 images given"));
    }
}
