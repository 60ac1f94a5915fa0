//! The V4.1 image token rule: an image is resized to whole 14-px patches, merged 3x3 into LLM cells;
//! it costs `rows * (columns + 1) + 2` tokens (a row separator per row plus begin/end), at most 1024.
//! Small images are first scaled up to a minimum area, large ones fitted into the token budget.

const PATCH: u64 = 14;
const MERGE: u64 = 3;
const CELL: u64 = PATCH * MERGE;
const MAX_TOKENS: u64 = 1024;
const MIN_PIXELS: u64 = 295_936;
/// Fitting repeats until the size is stable; it settles after one or two rounds in practice.
const MAX_ROUNDS: usize = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resize {
    pub width: u32,
    pub height: u32,
    pub tokens: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CalcResizeError {
    #[error("image token resize has no solution")]
    NoSolution,
    #[error("image token resize does not converge")]
    NotConverged,
}

fn cells(px: u64) -> u64 {
    (px / PATCH).div_ceil(MERGE)
}

fn tokens_for(rows: u64, columns: u64) -> u64 {
    rows * (columns + 1) + 2
}

fn measured(width: u64, height: u64) -> Resize {
    Resize { width: width as u32, height: height as u32, tokens: tokens_for(cells(height), cells(width)) }
}

/// The largest cell grid of the image's aspect ratio within `budget` tokens.
fn fit_budget(width: u64, height: u64, budget: u64) -> Result<Resize, CalcResizeError> {
    let (w, h) = (width as f64, height as f64);
    let ratio = h / w;
    let columns = (((budget - 2) as f64 / ratio + 0.25).sqrt() - 0.5).max(0.0);
    let rows = columns * ratio;
    let (best_w, best_h) = if columns < 1.0 {
        (CELL, (budget - 2) / 2 * CELL)
    } else if rows < 1.0 {
        let cols = (budget - 2) - 1;
        if cols <= 1 {
            return Err(CalcResizeError::NoSolution);
        }
        (cols * CELL, CELL)
    } else {
        let scale = ((columns.trunc() * CELL as f64) / w).min((rows.trunc() * CELL as f64) / h);
        let snap = |v: f64| (v * scale / PATCH as f64).trunc() as u64 * PATCH;
        (snap(w), snap(h))
    };
    Ok(measured(best_w, best_h))
}

fn round(width: u64, height: u64) -> Result<Resize, CalcResizeError> {
    let (mut w, mut h) = (width, height);
    let pixels = w * h;
    if pixels > 0 && pixels < MIN_PIXELS {
        let scale = (MIN_PIXELS as f64 / pixels as f64).sqrt();
        w = (w as f64 * scale).trunc() as u64;
        h = (h as f64 * scale).trunc() as u64;
    }
    let padded = measured(w.div_ceil(PATCH) * PATCH, h.div_ceil(PATCH) * PATCH);
    if padded.tokens <= MAX_TOKENS {
        return Ok(padded);
    }
    fit_budget(w, h, MAX_TOKENS)
}

/// The size an image is resized to and its token count.
pub fn calc_resize(width: u32, height: u32) -> Result<Resize, CalcResizeError> {
    let mut current = round(width.into(), height.into())?;
    for _ in 1..MAX_ROUNDS {
        let next = round(current.width.into(), current.height.into())?;
        if next == current {
            return Ok(current);
        }
        current = next;
    }
    Err(CalcResizeError::NotConverged)
}

#[cfg(test)]
mod tests {
    use super::calc_resize;

    #[test]
    fn documented_examples() {
        let tokens = |w, h| calc_resize(w, h).unwrap().tokens - 1;
        assert_eq!(tokens(1, 1), 183);
        assert_eq!(tokens(640, 480), 205);
        assert_eq!(tokens(1024, 1024), 651);
        assert_eq!(tokens(2048, 1536), 1000);
        let r = calc_resize(40, 30).unwrap();
        assert_eq!((r.width, r.height), (630, 476));
    }
}
