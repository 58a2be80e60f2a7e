//! The pipeline's one resize, [`resize_rgb8`], in a crate of its own so that fast_image_resize's convolutions are
//! compiled once.
//!
//! Generic code is compiled into the crate that instantiates it. fast_image_resize's `resize` matches the pixel type
//! at run time, and so compiles its convolutions for all 13 of its pixel types, for each pair of image types it is
//! called with, in each crate that calls it. The pipeline resizes RGB8 only, through this one non-generic function:
//! its convolutions are this crate's machine code, built once, instead of again in each crate and test binary that
//! resizes (rn50-pipeline's library and its unit tests were each compiled with them: 74 and 81 CPU-seconds on the
//! 2-core CI machine; docs/testing.md).

use fast_image_resize::images::{CroppedImage, Image, ImageRef};
use fast_image_resize::pixels::U8x3;
use fast_image_resize::{IntoImageView, IntoImageViewMut, ResizeError, ResizeOptions, Resizer};

/// The `window` (left, top, width, height; `None`: the whole image) of the RGB8 image `src` resized into `dst` with
/// `opts`, whose crop is relative to the window: `resizer.resize` for the pipeline's only kind of image. The whole
/// image is a window too, so that the convolutions are compiled for one type of source and one of destination (a
/// second source type was another third of their code).
pub fn resize_rgb8(
    resizer: &mut Resizer,
    src: &ImageRef,
    window: Option<[u32; 4]>,
    dst: &mut Image,
    opts: &ResizeOptions,
) -> Result<(), ResizeError> {
    let [left, top, width, height] = window.unwrap_or([0, 0, src.width(), src.height()]);
    let view = CroppedImage::new(src, left, top, width, height)?;
    let resized = match (view.image_view::<U8x3>(), dst.image_view_mut::<U8x3>()) {
        (Some(src), Some(mut dst)) => resizer.resize_typed(&src, &mut dst, opts),
        _ => Err(ResizeError::PixelTypesAreDifferent),
    };
    resized
}
