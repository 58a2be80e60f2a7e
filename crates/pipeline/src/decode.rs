//! Image decoding: JPEG through libjpeg-turbo's TurboJPEG 3 API (DCT-domain downscaling and
//! partial decompression of just the needed region), PNG through the `png` crate (ImageNet has a
//! PNG stored under a `.JPEG` name). Every supported input comes out as packed RGB8: grayscale is
//! replicated, CMYK/YCCK is converted the way Pillow's `convert("RGB")` does it.
//!
//! Errors are values, never panics: corrupt data, truncated files and absurd dimensions all map
//! to a [`DecodeError`]. An image with more pixels than the limit ([`MAX_IMAGE_PIXELS`] unless set)
//! is refused from its header, before its pixel buffer is allocated. Benign libjpeg warnings (extraneous bytes, corrupt-but-decodable
//! entropy data) are tolerated as Pillow tolerates them; a premature end of file is an error, as
//! Pillow's "image file is truncated" is.
//!
//! The one-shot helpers [`decode_rgb`] and [`encode_jpeg`] are the shared API other crates use
//! (e.g. to re-encode ImageNet's CMYK and PNG files as RGB JPEG).

use std::ffi::{c_int, CStr};
use std::io::Cursor;

use turbojpeg::raw;

/// Default largest image, in pixels, we agree to decode: Pillow's `Image.MAX_IMAGE_PIXELS`
/// (a 24-bit image of 256 MiB). It guards against decompression bombs: a 16000x16000 JPEG or PNG of a
/// few kilobytes asks for 768 MB of pixels. Pillow warns above it and refuses above twice it; here
/// an image above the limit is a bad image. ILSVRC2012's largest images are far below it.
pub const MAX_IMAGE_PIXELS: u64 = 89_478_485;
/// Progressive JPEGs with absurd numbers of scans can take minutes to decode (a known libjpeg
/// denial of service); real photos have fewer than 20.
const MAX_SCANS: c_int = 500;
/// iMCU width per TJSAMP value (turbojpeg.h's `tjMCUWidth`, a header-only static).
const MCU_WIDTH: [usize; 7] = [8, 16, 16, 8, 8, 32, 8];

/// Why an image could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("unsupported image format (data starts with {0:02x?})")]
    UnsupportedFormat(Vec<u8>),
    #[error("truncated image data")]
    Truncated,
    #[error("invalid JPEG: {0}")]
    Jpeg(String),
    #[error("invalid PNG: {0}")]
    Png(String),
    #[error("image dimensions {0}x{1} out of range")]
    BadDimensions(usize, usize),
    #[error(
        "{width}x{height} image has more pixels than the limit of {limit} (--max-image-pixels)"
    )]
    TooManyPixels {
        width: usize,
        height: usize,
        limit: u64,
    },
    #[error("JPEG encoding failed: {0}")]
    Encode(String),
    #[error("decoder panicked: {0}")]
    Panic(String),
}

/// A packed RGB8 image (`pixels.len() == width * height * 3`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    pub pixels: Vec<u8>,
}

/// Container formats recognised by their magic bytes (file names are not trusted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Jpeg,
    Png,
}

/// Identify the format from the first bytes. JPEG needs only `FF D8`: libjpeg itself accepts
/// junk between SOI and the next marker, and so does Pillow.
pub fn sniff(bytes: &[u8]) -> Option<Format> {
    if bytes.starts_with(&[0xFF, 0xD8]) {
        Some(Format::Jpeg)
    } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(Format::Png)
    } else {
        None
    }
}

/// Decode any supported image (JPEG incl. grayscale/CMYK/YCCK/progressive, PNG) to RGB8, up to
/// [`MAX_IMAGE_PIXELS`].
pub fn decode_rgb(bytes: &[u8]) -> Result<RgbImage, DecodeError> {
    decode_rgb_with_limit(bytes, MAX_IMAGE_PIXELS)
}

/// [`decode_rgb`] for images of at most `max_image_pixels` pixels.
pub fn decode_rgb_with_limit(bytes: &[u8], max_image_pixels: u64) -> Result<RgbImage, DecodeError> {
    let mut dec = Decoder::new()?;
    dec.set_max_image_pixels(max_image_pixels);
    let d = dec.decode(bytes, Plan::full)?;
    Ok(RgbImage {
        width: d.width,
        height: d.height,
        pixels: d.pixels.to_vec(),
    })
}

/// Encode packed RGB8 pixels as a baseline JPEG (4:2:0) at `quality` (1–100).
pub fn encode_jpeg(
    width: usize,
    height: usize,
    rgb: &[u8],
    quality: u8,
) -> Result<Vec<u8>, DecodeError> {
    if width == 0 || height == 0 || rgb.len() != width * height * 3 {
        return Err(DecodeError::Encode(format!(
            "{}x{} image needs {} bytes, got {}",
            width,
            height,
            width * height * 3,
            rgb.len()
        )));
    }
    let image = turbojpeg::Image {
        pixels: rgb,
        width,
        pitch: width * 3,
        height,
        format: turbojpeg::PixelFormat::RGB,
    };
    let enc = |e: turbojpeg::Error| DecodeError::Encode(e.to_string());
    let mut c = turbojpeg::Compressor::new().map_err(enc)?;
    c.set_quality(quality.clamp(1, 100) as i32).map_err(enc)?;
    c.set_subsamp(turbojpeg::Subsamp::Sub2x2).map_err(enc)?;
    c.compress_to_vec(image).map_err(enc)
}

/// What part of an image to decode, decided by the caller once it knows the dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Region of the original image that must be present in the output: x, y, width, height.
    pub region: [usize; 4],
    /// Allowed DCT-domain downscale: 1, 2, 4 or 8. Ignored for non-JPEG data.
    pub downscale: usize,
}

impl Plan {
    /// The whole image at full resolution.
    pub fn full(width: usize, height: usize) -> Plan {
        Plan {
            region: [0, 0, width, height],
            downscale: 1,
        }
    }
}

/// Result of [`Decoder::decode`]: RGB8 pixels covering (at least) the planned region.
#[derive(Debug)]
pub struct Decoded<'a> {
    pub pixels: &'a [u8],
    pub width: usize,
    pub height: usize,
    /// Dimensions of the original image.
    pub full_width: usize,
    pub full_height: usize,
    /// Original-image coordinate of pixel (0, 0) of `pixels`.
    pub origin: [usize; 2],
    /// Original pixels per decoded pixel (the DCT downscale actually used).
    pub downscale: usize,
}

/// A decoder with reusable scratch buffers, meant to live in one worker thread.
///
/// Every JPEG gets a fresh TurboJPEG handle, and the output buffers are cleared first, so each file
/// gets the verdict and pixels a new decoder would give it. A reused handle carried state from one
/// file to the next: after `crashtest/invalid-dimensions.jpg`, good photos failed with "Bogus marker
/// length"; after a good photo, a 2-byte `FF D8` file (whose header read succeeds on a tables-only
/// stream and changes nothing) decoded with the previous photo's size; and a corrupt file that decodes
/// with warnings left rows libjpeg never wrote holding the previous image.
pub struct Decoder {
    tj: TjHandle,
    out: Vec<u8>,
    cmyk: Vec<u8>,
    max_image_pixels: u64,
}

struct TjHandle(raw::tjhandle);

impl TjHandle {
    /// A decompression handle with rn50's limits set.
    fn new(max_image_pixels: u64) -> Result<TjHandle, DecodeError> {
        // SAFETY: plain FFI constructor; null is checked.
        let h = TjHandle(unsafe { raw::tj3Init(raw::TJINIT_TJINIT_DECOMPRESS as c_int) });
        if h.0.is_null() {
            return Err(DecodeError::Jpeg("tj3Init failed".into()));
        }
        // Accurate IDCT and smooth (fancy) upsampling stay on: they match Pillow bit for bit,
        // and libjpeg-turbo 3.1.0's fast (merged) upsampling segfaulted in jpeg_skip_scanlines
        // under partial decompression in our stress runs.
        // The library's own pixel limit backs up the header check (0, none, where the limit does
        // not fit its int).
        let max_pixels = c_int::try_from(max_image_pixels).unwrap_or(0);
        for (param, value) in [
            (raw::TJPARAM_TJPARAM_SCANLIMIT, MAX_SCANS),
            (raw::TJPARAM_TJPARAM_MAXPIXELS, max_pixels),
        ] {
            // SAFETY: valid handle; tj3Set validates param/value.
            if unsafe { raw::tj3Set(h.0, param as c_int, value) } != 0 {
                return Err(DecodeError::Jpeg(format!("tj3Set({param}) failed")));
            }
        }
        Ok(h)
    }
}

// The handle is only used through &mut self; TurboJPEG handles may move between threads.
unsafe impl Send for TjHandle {}

impl Drop for TjHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed exactly once.
        unsafe { raw::tj3Destroy(self.0) }
    }
}

struct JpegHeader {
    width: usize,
    height: usize,
    subsamp: c_int,
    cmyk: bool,
}

impl Decoder {
    /// A decoder for images of up to [`MAX_IMAGE_PIXELS`] pixels.
    pub fn new() -> Result<Decoder, DecodeError> {
        Ok(Decoder {
            tj: TjHandle::new(MAX_IMAGE_PIXELS)?,
            out: Vec::new(),
            cmyk: Vec::new(),
            max_image_pixels: MAX_IMAGE_PIXELS,
        })
    }

    /// Images with more pixels than this are refused with [`DecodeError::TooManyPixels`], from the
    /// header, before the pixel buffer is allocated.
    pub fn set_max_image_pixels(&mut self, max_image_pixels: u64) {
        self.max_image_pixels = max_image_pixels;
    }

    /// Decode `bytes`; `plan` is called with the image's width and height and chooses the region
    /// and downscale. The result covers the region, possibly with a few extra pixels (JPEG
    /// partial decompression starts on an iMCU boundary).
    pub fn decode<F>(&mut self, bytes: &[u8], plan: F) -> Result<Decoded<'_>, DecodeError>
    where
        F: FnOnce(usize, usize) -> Plan,
    {
        match sniff(bytes) {
            Some(Format::Jpeg) => self.decode_jpeg(bytes, plan),
            Some(Format::Png) => {
                let (w, h) = decode_png(bytes, &mut self.out, self.max_image_pixels)?;
                let _ = plan(w, h);
                Ok(Decoded {
                    pixels: &self.out[..w * h * 3],
                    width: w,
                    height: h,
                    full_width: w,
                    full_height: h,
                    origin: [0, 0],
                    downscale: 1,
                })
            }
            None => Err(DecodeError::UnsupportedFormat(
                bytes[..bytes.len().min(8)].to_vec(),
            )),
        }
    }

    fn get(&mut self, param: raw::TJPARAM) -> c_int {
        // SAFETY: valid handle.
        unsafe { raw::tj3Get(self.tj.0, param as c_int) }
    }

    fn error(&mut self) -> DecodeError {
        // SAFETY: tj3GetErrorStr returns a NUL-terminated string owned by the library.
        let msg = unsafe { CStr::from_ptr(raw::tj3GetErrorStr(self.tj.0)) }
            .to_string_lossy()
            .trim()
            .to_string();
        if is_truncation(&msg) {
            DecodeError::Truncated
        } else {
            DecodeError::Jpeg(msg)
        }
    }

    /// After a TurboJPEG call returned -1: was it only a warning we can live with?
    fn tolerable_warning(&mut self) -> Result<(), DecodeError> {
        // SAFETY: valid handle.
        let code = unsafe { raw::tj3GetErrorCode(self.tj.0) };
        let err = self.error();
        match err {
            DecodeError::Jpeg(_) if code == raw::TJERR_TJERR_WARNING as c_int => Ok(()),
            e => Err(e),
        }
    }

    fn header(&mut self, bytes: &[u8]) -> Result<JpegHeader, DecodeError> {
        // SAFETY: pointer/length describe a live slice.
        let r = unsafe { raw::tj3DecompressHeader(self.tj.0, bytes.as_ptr(), bytes.len() as _) };
        if r != 0 {
            self.tolerable_warning()?;
        }
        let width = self.get(raw::TJPARAM_TJPARAM_JPEGWIDTH).max(0) as usize;
        let height = self.get(raw::TJPARAM_TJPARAM_JPEGHEIGHT).max(0) as usize;
        check_size(width, height, self.max_image_pixels)?;
        if self.get(raw::TJPARAM_TJPARAM_LOSSLESS) != 0
            || self.get(raw::TJPARAM_TJPARAM_PRECISION) != 8
        {
            return Err(DecodeError::Jpeg(
                "only 8-bit lossy JPEG is supported".into(),
            ));
        }
        let cs = self.get(raw::TJPARAM_TJPARAM_COLORSPACE);
        Ok(JpegHeader {
            width,
            height,
            subsamp: self.get(raw::TJPARAM_TJPARAM_SUBSAMP),
            cmyk: cs == raw::TJCS_TJCS_CMYK as c_int || cs == raw::TJCS_TJCS_YCCK as c_int,
        })
    }

    fn decode_jpeg<F>(&mut self, bytes: &[u8], plan: F) -> Result<Decoded<'_>, DecodeError>
    where
        F: FnOnce(usize, usize) -> Plan,
    {
        // A fresh handle for every file, as `pack` has: see the type's comment.
        self.tj = TjHandle::new(self.max_image_pixels)?;
        let hdr = self.header(bytes)?;
        let (w, h) = (hdr.width, hdr.height);
        let plan = plan(w, h);
        let [rx, ry, rw, rh] = clamp_region(plan.region, w, h);
        let d = match plan.downscale {
            8 | 4 | 2 => plan.downscale,
            _ => 1,
        };
        let sf = raw::tjscalingfactor {
            num: 1,
            denom: d as c_int,
        };
        // SAFETY: valid handle; the factor is one libjpeg-turbo supports (1/1, 1/2, 1/4, 1/8).
        if unsafe { raw::tj3SetScalingFactor(self.tj.0, sf) } != 0 {
            return Err(self.error());
        }
        // Scaled full image and scaled region (rounded outwards), as TJSCALED computes them.
        let (sw, sh) = (w.div_ceil(d), h.div_ceil(d));
        let (mut x0, y0) = (rx / d, ry / d);
        let x1 = (rx + rw).div_ceil(d).min(sw);
        let mut y1 = (ry + rh).div_ceil(d).min(sh);
        // Partial decompression needs a known subsampling (for the iMCU width below); other
        // files are decoded whole.
        let croppable = (0..7).contains(&hdr.subsamp);
        // A crop that stops above the last row may leave the end of the file unread, and with it
        // the file's verdict: then it goes on to the bottom (see `any_crop_reads_to_the_end`).
        if croppable && y1 < sh && !any_crop_reads_to_the_end(bytes) {
            y1 = sh;
        }
        // Partial decompression needs the left edge on a (scaled) iMCU boundary.
        let region = if croppable && (x0, y0, x1, y1) != (0, 0, sw, sh) {
            let mcu = MCU_WIDTH[hdr.subsamp as usize];
            let smcu = mcu.div_ceil(d);
            x0 -= x0 % smcu;
            raw::tjregion {
                x: x0 as c_int,
                y: y0 as c_int,
                w: (x1 - x0) as c_int,
                h: (y1 - y0) as c_int,
            }
        } else {
            x0 = 0;
            raw::tjregion {
                x: 0,
                y: 0,
                w: 0,
                h: 0,
            }
        };
        let (ow, oh, oy) = if region.w == 0 {
            (sw, sh, 0)
        } else {
            (x1 - x0, y1 - y0, y0)
        };
        // SAFETY: valid handle; the region was validated against the scaled size above and the
        // library re-checks it.
        if unsafe { raw::tj3SetCroppingRegion(self.tj.0, region) } != 0 {
            return Err(self.error());
        }
        let (format, px) = if hdr.cmyk {
            (raw::TJPF_TJPF_CMYK, 4)
        } else {
            (raw::TJPF_TJPF_RGB, 3)
        };
        let dst = if hdr.cmyk {
            &mut self.cmyk
        } else {
            &mut self.out
        };
        // Zeroed, not just sized: rows a corrupt file never gets to must not show the last image.
        dst.clear();
        dst.resize(ow * oh * px, 0);
        let dst_ptr = dst.as_mut_ptr();
        // SAFETY: dst holds ow*oh*px bytes, exactly what TurboJPEG writes for this scaling
        // factor, cropping region and pitch.
        let r = unsafe {
            raw::tj3Decompress8(
                self.tj.0,
                bytes.as_ptr(),
                bytes.len() as _,
                dst_ptr,
                (ow * px) as c_int,
                format,
            )
        };
        if r != 0 {
            self.tolerable_warning()?;
        }
        if hdr.cmyk {
            self.out.resize(ow * oh * 3, 0);
            cmyk_to_rgb(&self.cmyk[..ow * oh * 4], &mut self.out[..ow * oh * 3]);
        }
        Ok(Decoded {
            pixels: &self.out[..ow * oh * 3],
            width: ow,
            height: oh,
            full_width: w,
            full_height: h,
            origin: [x0 * d, oy * d],
            downscale: d,
        })
    }
}

/// Dimensions from a header: neither side empty, and within the pixel limit.
fn check_size(width: usize, height: usize, limit: u64) -> Result<(), DecodeError> {
    if width == 0 || height == 0 {
        return Err(DecodeError::BadDimensions(width, height));
    }
    if width as u64 * height as u64 > limit {
        return Err(DecodeError::TooManyPixels {
            width,
            height,
            limit,
        });
    }
    Ok(())
}

fn clamp_region([x, y, w, h]: [usize; 4], iw: usize, ih: usize) -> [usize; 4] {
    let x = x.min(iw - 1);
    let y = y.min(ih - 1);
    [x, y, w.clamp(1, iw - x), h.clamp(1, ih - y)]
}

/// Whether libjpeg reads `bytes` to their end (what decides the file's verdict) even when the
/// cropping region stops above the image's last row; if not, the region must go on to the bottom.
///
/// Without that, a truncated photo was good for the crops above its missing rows and bad for the
/// others, so its verdict changed from epoch to epoch. For a single-scan (baseline) JPEG, skipping
/// the rows below the crop (`jpeg_skip_scanlines` to the bottom) marks the end of the image as
/// reached without reading on: the entropy-coded rows below and the markers after them, a
/// premature end of the file or a marker that is an error, go unseen. A multi-scan (progressive)
/// file is read whole before any row comes out, and so is a single-scan one whose entropy-coded
/// data ends at its end-of-image marker: the rows below the crop can then only hold corrupt data,
/// which libjpeg warns about and decodes anyway, as it does for a full decode. Both are recognised
/// here by walking the markers as libjpeg's `next_marker` finds them and searching the entropy-coded
/// data for its first marker: a pass over the bytes, no decoding, so good files keep the cropped
/// decode. Anything else (cut short, or some other marker first) answers `false`, which costs
/// only the decoding of the rows below the crop.
fn any_crop_reads_to_the_end(bytes: &[u8]) -> bool {
    let (mut at, mut progressive, mut components) = (2, false, 0);
    loop {
        let Some((marker, after)) = next_marker(bytes, at) else {
            return false;
        };
        at = after;
        if marker == 0x01 || (0xD0..=0xD7).contains(&marker) {
            continue; // no length; libjpeg traces and skips these
        }
        if marker == 0xD8 || marker == 0xD9 {
            return false; // a second SOI, or the end before any scan: no image
        }
        let Some(len) = bytes
            .get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
        else {
            return false;
        };
        let Some(segment) = bytes.get(at + 2..at + len.max(2)) else {
            return false;
        };
        at += len.max(2);
        match marker {
            // SOF0..SOF15 less DHT, JPG and DAC: P, Y, X, then the number of components.
            0xC0..=0xCF if ![0xC4, 0xC8, 0xCC].contains(&marker) => {
                progressive = matches!(marker, 0xC2 | 0xC6 | 0xCA | 0xCE);
                components = segment.get(5).copied().unwrap_or(0);
            }
            0xDA => {
                let in_scan = segment.first().copied().unwrap_or(0);
                if progressive || in_scan < components {
                    return true; // several scans: all read before the first row
                }
                // One scan: its first marker, past stuffed zeros and restarts, must be EOI.
                return matches!(next_marker_in_scan(bytes, at), Some(0xD9));
            }
            _ => {}
        }
    }
}

/// The marker code at or after `at` and the position after it, as libjpeg's `next_marker` finds
/// it: bytes up to an 0xFF are skipped, then fill bytes (0xFF), and `FF 00` is no marker.
fn next_marker(bytes: &[u8], mut at: usize) -> Option<(u8, usize)> {
    loop {
        at = find_ff(bytes, at)?;
        while *bytes.get(at + 1)? == 0xFF {
            at += 1;
        }
        let code = bytes[at + 1];
        at += 2;
        if code != 0 {
            return Some((code, at));
        }
    }
}

/// The first marker of entropy-coded data starting at `at` that ends it: not a restart (RSTn).
fn next_marker_in_scan(bytes: &[u8], mut at: usize) -> Option<u8> {
    loop {
        let (code, after) = next_marker(bytes, at)?;
        if !(0xD0..=0xD7).contains(&code) {
            return Some(code);
        }
        at = after;
    }
}

/// Position of the first 0xFF at or after `from`. Entropy-coded data is most of a JPEG: 32 bytes
/// at a time, through a byte-wise maximum the compiler vectorises.
fn find_ff(bytes: &[u8], from: usize) -> Option<usize> {
    let rest = bytes.get(from..)?;
    let mut base = from;
    for c in rest.chunks_exact(32) {
        if c.iter().fold(0, |m: u8, &b| m.max(b)) == 0xFF {
            break;
        }
        base += 32;
    }
    bytes[base..]
        .iter()
        .position(|&b| b == 0xFF)
        .map(|i| base + i)
}

/// libjpeg's warning for data that ends before the image does (JWRN_JPEG_EOF).
fn is_truncation(msg: &str) -> bool {
    msg.contains("Premature end of JPEG file")
}

/// CMYK as libjpeg hands it out for Adobe files (inverted) to RGB; this is Pillow's
/// `CMYK;I` raw mode followed by `convert("RGB")`: R = C·K/255 on the stored values.
fn cmyk_to_rgb(cmyk: &[u8], rgb: &mut [u8]) {
    for (s, d) in cmyk.chunks_exact(4).zip(rgb.chunks_exact_mut(3)) {
        let k = s[3] as u32;
        for c in 0..3 {
            // Exact rounding of x*k/255 as Pillow's MULDIV255.
            let t = s[c] as u32 * k + 128;
            d[c] = ((t + (t >> 8)) >> 8) as u8;
        }
    }
}

/// Decode a PNG into `out` as RGB8 (alpha dropped, as Pillow's `convert("RGB")` does), if it has
/// at most `max_pixels` pixels.
fn decode_png(
    bytes: &[u8],
    out: &mut Vec<u8>,
    max_pixels: u64,
) -> Result<(usize, usize), DecodeError> {
    let perr = |e: png::DecodingError| DecodeError::Png(e.to_string());
    let mut dec = png::Decoder::new(Cursor::new(bytes));
    dec.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = dec.read_info().map_err(perr)?;
    let (w, h) = {
        let info = reader.info();
        (info.width as usize, info.height as usize)
    };
    check_size(w, h, max_pixels)?;
    let size = reader
        .output_buffer_size()
        .ok_or(DecodeError::BadDimensions(w, h))?;
    let mut raw_buf = vec![0; size];
    let frame = reader.next_frame(&mut raw_buf).map_err(|e| match e {
        png::DecodingError::IoError(_) => DecodeError::Truncated,
        e => perr(e),
    })?;
    let line = frame.line_size;
    let channels = match frame.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => {
            return Err(DecodeError::Png("palette was not expanded".into()));
        }
    };
    out.resize(w * h * 3, 0);
    for y in 0..h {
        let src = &raw_buf[y * line..y * line + w * channels];
        let dst = &mut out[y * w * 3..(y + 1) * w * 3];
        for (s, d) in src.chunks_exact(channels).zip(dst.chunks_exact_mut(3)) {
            if channels <= 2 {
                d.fill(s[0]);
            } else {
                d.copy_from_slice(&s[..3]);
            }
        }
    }
    Ok((w, h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmyk_conversion_matches_pillow_formula() {
        // Pillow: CLIP8(nk - MULDIV255(c', nk)) with c' = 255 - c, nk = k (inverted storage).
        for c in (0..=255u32).step_by(5) {
            for k in (0..=255u32).step_by(5) {
                let mut out = [0u8; 3];
                cmyk_to_rgb(&[c as u8, c as u8, c as u8, k as u8], &mut out);
                let want = ((c * k) as f64 / 255.0).round() as u8;
                assert_eq!(out[0], want, "c={c} k={k}");
            }
        }
    }

    #[test]
    fn encode_then_decode_round_trips() {
        let (w, h) = (67, 45);
        let rgb: Vec<u8> = (0..w * h * 3)
            .map(|i| ((i / 3 % w) * 3 + (i / 3 / w) * 2) as u8)
            .collect();
        let jpg = encode_jpeg(w, h, &rgb, 95).unwrap();
        let img = decode_rgb(&jpg).unwrap();
        assert_eq!((img.width, img.height), (w, h));
        let mae: f64 = img
            .pixels
            .iter()
            .zip(&rgb)
            .map(|(a, b)| (*a as f64 - *b as f64).abs())
            .sum::<f64>()
            / rgb.len() as f64;
        assert!(mae < 3.0, "mean abs error {mae}");
    }

    /// `jpeg/<sub>` in the shared test data (`RN50_SHARED_DATA`, as the integration tests).
    fn shared_jpeg(sub: &str) -> std::path::PathBuf {
        std::env::var_os("RN50_SHARED_DATA")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data").into())
            .join("jpeg")
            .join(sub)
    }

    /// The 220 ImageNet photos in the shared test data, read.
    fn imagenet_photos() -> Vec<Vec<u8>> {
        let dir = shared_jpeg("imagenet");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot list {} ({e}): set RN50_SHARED_DATA", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files.iter().map(|f| std::fs::read(f).unwrap()).collect()
    }

    /// Real photos keep the cropped decode (the scan finds their end-of-image marker); the same
    /// photos cut short anywhere after their header, or with a stray marker after their data, decode
    /// on to the bottom; progressive files are read whole anyway.
    #[test]
    fn only_files_read_to_their_end_keep_the_cropped_decode() {
        let photos = imagenet_photos();
        assert_eq!(photos.len(), 220);
        for (i, p) in photos.iter().enumerate() {
            assert!(any_crop_reads_to_the_end(p), "photo {i}");
            let data = p.len() / 2;
            for cut in [data, p.len() * 9 / 10, p.len() - 2, p.len() - 1] {
                assert!(
                    !any_crop_reads_to_the_end(&p[..cut]),
                    "photo {i} cut to {cut}"
                );
            }
            let mut sof_after = p[..p.len() - 2].to_vec();
            sof_after.extend_from_slice(&[0xFF, 0xC0, 0x00, 0x02, 0xFF, 0xD9]);
            assert!(!any_crop_reads_to_the_end(&sof_after), "photo {i} + SOF");
            // Trailing bytes after EOI are not read by libjpeg, cropped or not.
            let mut trailing = p.clone();
            trailing.extend_from_slice(b"\xFF\xC0 trailing junk");
            assert!(any_crop_reads_to_the_end(&trailing), "photo {i} + junk");
        }
        let progressive = std::fs::read(shared_jpeg("edge/progressive_imagenet.jpg")).unwrap();
        assert!(any_crop_reads_to_the_end(
            &progressive[..progressive.len() / 2]
        ));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(matches!(
            decode_rgb(b"GIF89a...."),
            Err(DecodeError::UnsupportedFormat(_))
        ));
        assert!(decode_rgb(&[0xFF, 0xD8, 0xFF]).is_err());
        assert!(decode_rgb(b"\x89PNG\r\n\x1a\n").is_err());
        assert!(decode_rgb(&[]).is_err());
    }
}
