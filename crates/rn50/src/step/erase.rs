//! Random erasing (torchvision's `RandomErasing(value=0)`, `--random-erase`) on the device: the loader draws each
//! image's box, the step zeroes it after normalisation.
use rn50_pipeline::transform::Erase;
use tch::Tensor;

/// Zeroes random erasing's boxes, each `(image's position in the batch, box)`, in `x`, a normalised `[N, 3, H, W]`
/// batch (any memory format), in place. torchvision's `RandomErasing(value=0)` runs after `Normalize`, so its zero is
/// the mean colour, which no uint8 value is: the loader draws the boxes and they are zeroed here.
pub fn erase(x: &mut Tensor, boxes: &[(usize, Erase)]) {
    tch::no_grad(|| {
        for (image, b) in boxes {
            let _ = x
                .narrow(0, *image as i64, 1)
                .narrow(2, b.top as i64, b.height as i64)
                .narrow(3, b.left as i64, b.width as i64)
                .fill_(0.0);
        }
    });
}
