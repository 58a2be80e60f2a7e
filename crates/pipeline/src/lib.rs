//! rn50-pipeline: the ImageNet input pipeline (work in progress; see docs/pipeline.md).

pub mod decode;
