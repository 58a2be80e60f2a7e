//! Files that are not plain RGB/grayscale JPEGs, detected by content (never by name): CMYK or
//! YCCK JPEGs (4 components, Adobe), PNGs named `.JPEG`, and data that is neither.

use anyhow::{Context, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OddKind {
    /// 4-component JPEG with Adobe transform 0 (or none): CMYK.
    Cmyk,
    /// 4-component JPEG with Adobe transform 2: YCCK.
    Ycck,
    Png,
    /// Neither a JPEG nor a PNG.
    Unknown,
}

impl OddKind {
    pub fn describe(self) -> &'static str {
        match self {
            OddKind::Cmyk => "CMYK JPEG",
            OddKind::Ycck => "YCCK JPEG",
            OddKind::Png => "PNG data with a JPEG name",
            OddKind::Unknown => "neither JPEG nor PNG",
        }
    }

    /// Whether `--fix-odd-files` can re-encode it.
    pub fn fixable(self) -> bool {
        self != OddKind::Unknown
    }
}

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

/// Classifies an image from its bytes; `None` for an ordinary 1- or 3-component JPEG.
pub fn detect(data: &[u8]) -> Option<OddKind> {
    if data.starts_with(PNG_MAGIC) {
        return Some(OddKind::Png);
    }
    if !data.starts_with(&[0xFF, 0xD8]) {
        return Some(OddKind::Unknown);
    }
    // Walk the marker segments up to the frame header (SOFn), noting an Adobe APP14 transform.
    let mut adobe_transform = None;
    let mut i = 2;
    while i + 4 <= data.len() {
        if data[i] != 0xFF {
            return None; // not at a marker: leave judging the file to the decoder
        }
        let marker = data[i + 1];
        if marker == 0xFF {
            i += 1; // fill byte
            continue;
        }
        if marker == 0x01 || (0xD0..=0xD7).contains(&marker) {
            i += 2; // markers without a length
            continue;
        }
        let len = u16::from_be_bytes([data[i + 2], data[i + 3]]) as usize;
        let seg = data.get(i + 4..i + 2 + len)?;
        match marker {
            0xEE if seg.starts_with(b"Adobe") && seg.len() >= 12 => adobe_transform = Some(seg[11]),
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                let components = *seg.get(5)?;
                return (components == 4).then_some(if adobe_transform == Some(2) {
                    OddKind::Ycck
                } else {
                    OddKind::Cmyk
                });
            }
            0xDA | 0xD9 => return None,
            _ => {}
        }
        i += 2 + len;
    }
    None
}

/// Re-encodes a CMYK/YCCK JPEG or a PNG as an RGB JPEG at quality 95 (high, so the one extra
/// generation of loss is negligible), with the pipeline's decoder (CMYK converted as Pillow does).
pub fn fix(data: &[u8]) -> Result<Vec<u8>> {
    use rn50_pipeline::decode::{decode_rgb, encode_jpeg};
    let rgb = decode_rgb(data).context("decoding")?;
    encode_jpeg(rgb.width, rgb.height, &rgb.pixels, 95).context("encoding as an RGB JPEG")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn edge(name: &str) -> Vec<u8> {
        let root = std::env::var_os("RN50_SHARED_DATA")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data"))
            });
        std::fs::read(root.join("jpeg/edge").join(name)).unwrap()
    }

    #[test]
    fn detects_by_content() {
        assert_eq!(detect(&edge("cmyk_from_imagenet.jpg")), Some(OddKind::Cmyk));
        assert_eq!(detect(&edge("pil_sample_cmyk.jpg")), Some(OddKind::Ycck)); // Adobe transform 2
        assert_eq!(
            detect(&edge("ref_mozilla_jpg-cmyk-1.jpg")),
            Some(OddKind::Cmyk)
        );
        assert_eq!(detect(&edge("ref_ycck.jpg")), Some(OddKind::Ycck));
        assert_eq!(detect(&edge("png_named_as.JPEG")), Some(OddKind::Png));
        for normal in [
            "hopper_gray.jpg",
            "pil_sample_rgb.jpg",
            "progressive_imagenet.jpg",
            "hopper_orientation_6.jpg",
            "icc_profile_big.jpg",
        ] {
            assert_eq!(detect(&edge(normal)), None, "{normal}");
        }
        assert_eq!(detect(b"GIF89a"), Some(OddKind::Unknown));
        assert_eq!(detect(&[0xFF, 0xD8, 0xFF]), None);
    }

    #[test]
    fn fixed_files_are_plain_rgb_jpegs_of_the_same_size() {
        use rn50_pipeline::decode::decode_rgb;
        for name in [
            "cmyk_from_imagenet.jpg",
            "ref_ycck.jpg",
            "png_named_as.JPEG",
        ] {
            let orig = edge(name);
            let fixed = fix(&orig).unwrap();
            assert_eq!(detect(&fixed), None, "{name}");
            let (a, b) = (decode_rgb(&orig).unwrap(), decode_rgb(&fixed).unwrap());
            assert_eq!((a.width, a.height), (b.width, b.height), "{name}");
            let diff: u64 = a
                .pixels
                .iter()
                .zip(&b.pixels)
                .map(|(x, y)| x.abs_diff(*y) as u64)
                .sum();
            assert!(
                diff / (a.pixels.len() as u64) < 8,
                "{name}: re-encoding changed the picture"
            );
        }
        assert!(fix(b"not an image").is_err());
    }
}
