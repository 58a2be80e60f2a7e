//! Top-k accuracy, counted on the device so evaluation syncs once at the end, not per batch.
use tch::{Kind, Tensor};

/// Running top-1/top-5 counts.
pub struct Accuracy {
    correct1: Tensor,
    correct5: Tensor,
    /// Sum of the images' cross-entropy losses (fp64, on the device).
    loss_sum: Tensor,
    pub images: u64,
}

impl Accuracy {
    pub fn new(device: tch::Device) -> Self {
        let z = || Tensor::zeros([], (Kind::Int64, device));
        Self {
            correct1: z(),
            correct5: z(),
            loss_sum: Tensor::zeros([], (Kind::Double, device)),
            images: 0,
        }
    }

    /// Adds a batch of logits `[n, classes]` against `labels` `[n]`; top-5 is top-min(5, classes). The loss is
    /// the cross-entropy computed in fp32 (whatever the logits' precision), as main.py's validate() reports.
    pub fn add(&mut self, logits: &Tensor, labels: &Tensor) {
        let loss = logits.to_kind(Kind::Float).cross_entropy_loss(
            labels,
            None::<Tensor>,
            tch::Reduction::Sum,
            -100,
            0.0,
        );
        let _ = self.loss_sum.g_add_(&loss.to_kind(Kind::Double));
        let hits = ranked_hits(logits, labels, logits.size()[1].min(5));
        let _ = self.correct1.g_add_(&hits.narrow(1, 0, 1).sum(Kind::Int64));
        let _ = self
            .correct5
            .g_add_(&hits.any_dim(1, false).sum(Kind::Int64));
        self.images += labels.size()[0] as u64;
    }

    /// (top-1, top-5) correct predictions.
    pub fn counts(&self) -> (u64, u64) {
        let get = |t: &Tensor| i64::try_from(t).unwrap_or(0) as u64;
        (get(&self.correct1), get(&self.correct5))
    }

    /// The summed cross-entropy of every image added.
    pub fn loss_sum(&self) -> f64 {
        f64::try_from(&self.loss_sum).unwrap_or(f64::NAN)
    }

    /// (top-1 %, top-5 %).
    pub fn percent(&self) -> (f64, f64) {
        let n = self.images.max(1) as f64;
        let get = |t: &Tensor| i64::try_from(t).unwrap_or(0) as f64 * 100.0 / n;
        (get(&self.correct1), get(&self.correct5))
    }
}

/// `[n, k]`: whether each row's label is its j-th highest logit, j < `k` (main.py's accuracy()).
fn ranked_hits(logits: &Tensor, labels: &Tensor, k: i64) -> Tensor {
    let (_, idx) = logits.topk(k, 1, true, true);
    idx.eq_tensor(&labels.unsqueeze(1))
}

/// How many rows of `logits` `[n, classes]` rank their label first, as an int64 scalar on the device (no sync).
pub fn correct_top1(logits: &Tensor, labels: &Tensor) -> Tensor {
    ranked_hits(logits, labels, 1).sum(Kind::Int64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn counts_top1_and_top5() {
        let mut acc = Accuracy::new(Device::Cpu);
        // 6 classes; rows rank the classes 5 > 4 > 3 > 2 > 1 > 0.
        let logits = Tensor::arange(6, (Kind::Float, Device::Cpu)).repeat([4, 1]);
        let labels = Tensor::from_slice(&[5i64, 1, 0, 3]);
        acc.add(&logits, &labels);
        assert_eq!(acc.images, 4);
        let (t1, t5) = acc.percent();
        assert_eq!(t1, 25.0, "only label 5 is top-1");
        assert_eq!(t5, 75.0, "labels 5, 1, 3 are in the top 5; 0 is not");
        assert_eq!(i64::try_from(correct_top1(&logits, &labels)).unwrap(), 1);
    }
}
