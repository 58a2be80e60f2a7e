//! `rn50 classify`: the top classes of a few images under saved weights, with their names (the class folder names
//! rn50 recorded with the weights, or ImageNet's WordNet names): the image resized and center-cropped as
//! `rn50 eval` does (the sizes, mean and std recorded with the weights unless the flags say others), BN in eval
//! mode. A directory given stands for the JPEG and PNG files directly in it, in name order; `--json` writes every
//! image's top classes and logits.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use rn50_args::usize_in;
use rn50_pipeline::transform::Augmenter;
use rn50_pipeline::Transform;
use tch::{Kind, Tensor};

use crate::device::{Compute, ComputeArgs};
use crate::infer::{load_for_inference, Inference, ValSizeArgs};
use crate::model::weights::{printable, WeightsFile};
use crate::model::Arch;
use crate::step::Normalizer;

/// Print the top classes of images under saved weights.
#[derive(Args, Debug, Clone)]
pub struct ClassifyArgs {
    /// Images to classify (JPEG or PNG, told apart by content), or directories: a directory stands for the files
    /// directly in it named *.jpg, *.jpeg or *.png (any case), in name order; its subdirectories are not entered
    /// and other files are skipped (the log line says how many of each).
    #[arg(required = true, value_name = "IMG|DIR")]
    pub images: Vec<PathBuf>,
    /// Weights: safetensors with torchvision's keys (from `rn50 train`: best/final.safetensors or a checkpoint)
    /// or a torch.save file (torchvision's .pth, pytorch/examples' checkpoint.pth.tar), told apart by content.
    #[arg(long)]
    pub weights: PathBuf,
    /// Model architecture [default: the one recorded with the weights, else resnet50].
    #[arg(short = 'a', long = "arch", value_parser = clap::value_parser!(Arch))]
    pub arch: Option<Arch>,
    /// Classes printed per image, 1 to 1000.
    #[arg(long, default_value_t = 5, value_parser = usize_in(1..=1000))]
    pub top: usize,
    #[command(flatten)]
    pub sizes: ValSizeArgs,
    #[command(flatten)]
    pub compute: ComputeArgs,
    /// Also write the results as JSON to this file ("-": to stdout, instead of the table): for each image its
    /// path, its --top classes (index, name, probability) and the network's logits for every class.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// The extensions of the files a directory argument stands for: what [`Augmenter`] decodes (JPEG, PNG).
const IMAGE_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png"];

/// The images `args` stand for: a file as it is, a directory as its JPEG and PNG files (by extension, any case),
/// sorted by name, without entering its subdirectories. A directory with none is an error; what was left out of
/// each directory is logged.
fn expand(args: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut images = Vec::new();
    for arg in args {
        if !arg.is_dir() {
            images.push(arg.clone());
            continue;
        }
        let mut found = Vec::new();
        let (mut dirs, mut other) = (0, 0);
        for entry in std::fs::read_dir(arg).with_context(|| format!("listing {}", arg.display()))? {
            let path = entry
                .with_context(|| format!("listing {}", arg.display()))?
                .path();
            if path.is_dir() {
                dirs += 1;
            } else if is_image_name(&path) {
                found.push(path);
            } else {
                other += 1;
            }
        }
        if found.is_empty() {
            bail!(
                "{} has no image files (*.jpg, *.jpeg or *.png directly in it){}",
                arg.display(),
                match dirs {
                    0 => String::new(),
                    n =>
                        format!("; its {n} subdirectories are not entered: give them as arguments"),
                }
            );
        }
        found.sort();
        let mut left_out = Vec::new();
        if dirs > 0 {
            left_out.push(format!("{dirs} subdirectories not entered"));
        }
        if other > 0 {
            left_out.push(format!("{other} other files skipped"));
        }
        tracing::info!(
            "{}: {} images{}",
            arg.display(),
            found.len(),
            match left_out.is_empty() {
                true => String::new(),
                false => format!(" ({})", left_out.join(", ")),
            }
        );
        images.extend(found);
    }
    Ok(images)
}

fn is_image_name(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

/// One class of an image's top ones, in `--json`.
#[derive(serde::Serialize)]
struct Class<'a> {
    index: usize,
    name: &'a str,
    probability: f32,
}

/// One image's result, in `--json`.
#[derive(serde::Serialize)]
struct Classified<'a> {
    path: String,
    top: Vec<Class<'a>>,
    /// The network's outputs before the softmax, one per class, in class order.
    logits: Vec<f32>,
}

/// What each class is called, by index: the names recorded with the weights (the training set's folder names;
/// an ImageNet WordNet id gets its names too), else ImageNet's WordNet ids and names for 1,000 classes (torchvision's
/// weights), else `class i`.
fn class_names(recorded: Option<&[String]>, classes: usize) -> Vec<String> {
    let imagenet = rn50_data::imagenet_classes();
    let by_wnid: HashMap<&str, &str> = imagenet
        .iter()
        .filter_map(|line| Some((line.split_whitespace().next()?, *line)))
        .collect();
    (0..classes)
        .map(|i| match recorded {
            // Printed as they are but for control characters, escaped: the file is anyone's to write.
            Some(names) => by_wnid.get(names[i].as_str()).map_or_else(
                || printable(&names[i]).into_owned(),
                |line| line.to_string(),
            ),
            None if classes == imagenet.len() => imagenet[i].to_string(),
            None => format!("class {i}"),
        })
        .collect()
}

pub fn run(args: &ClassifyArgs) -> Result<()> {
    args.sizes.check(None)?;
    let to_stdout = args.json.as_deref() == Some(Path::new("-"));
    if let Some(p) = args.json.as_deref().filter(|_| !to_stdout) {
        crate::export::prepare_out("--json", p)?;
    }
    let images = expand(&args.images)?;
    let file = WeightsFile::read(&args.weights)?;
    let run = Inference::new(&file, args.arch, &args.sizes)?;
    let classes = file.shape()?.num_classes as usize;
    let names = class_names(file.classes(), classes);
    tracing::info!("rn50 classify: {}", run.used);
    let (
        model,
        Compute {
            device,
            precision,
            channels_last,
            ..
        },
    ) = load_for_inference(run.arch, &file, &args.compute)?;
    drop(file);
    let t = run.transform;
    let mut norm = Normalizer::with_stats(device, channels_last, t.mean, t.std);
    // Full-resolution decoding (no DCT downscale): the pixels torchvision's Resize would see.
    let mut augment = Augmenter::new(Transform::val(t.resize, t.crop), false)?;
    let crop = t.crop;
    let mut pixels = vec![0u8; crop * crop * 3];
    let top = args.top.min(classes);
    let mut results = Vec::new();
    for path in &images {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        augment
            .apply(&bytes, &mut rand::rng(), &mut pixels)
            .with_context(|| format!("decoding {}", path.display()))?;
        let x = Tensor::from_slice(&pixels)
            .view([1, crop as i64, crop as i64, 3])
            .to_device(device);
        let logits = tch::no_grad(|| -> Result<Tensor> {
            let _autocast = precision.autocast(device)?;
            let x = norm.normalize(&x);
            Ok(model.forward_t(&x, false).to_kind(Kind::Float))
        })?;
        let probs = logits.softmax(-1, Kind::Float);
        let (p, idx) = probs.topk(top as i64, -1, true, true);
        let p = Vec::<f32>::try_from(p.view([-1]).to_device(tch::Device::Cpu))?;
        let idx = Vec::<i64>::try_from(idx.view([-1]).to_device(tch::Device::Cpu))?;
        if !to_stdout {
            println!("{}", path.display());
            for (rank, (p, i)) in p.iter().zip(&idx).enumerate() {
                println!(
                    "{:>4}. {:6.2}%  {:>4}  {}",
                    rank + 1,
                    100.0 * p,
                    i,
                    names[*i as usize]
                );
            }
        }
        if args.json.is_some() {
            results.push(Classified {
                path: path.display().to_string(),
                top: p
                    .iter()
                    .zip(&idx)
                    .map(|(&probability, &i)| Class {
                        index: i as usize,
                        name: &names[i as usize],
                        probability,
                    })
                    .collect(),
                logits: Vec::<f32>::try_from(logits.view([-1]).to_device(tch::Device::Cpu))?,
            });
        }
    }
    if let Some(p) = &args.json {
        let text = serde_json::to_string_pretty(&serde_json::json!({
            "weights": args.weights.display().to_string(),
            "arch": run.arch.to_string(),
            "classes": classes,
            "resize": t.resize,
            "crop": t.crop,
            "images": results,
        }))? + "\n";
        match to_stdout {
            true => print!("{text}"),
            false => rn50_util::atomic_write(p, text.as_bytes())
                .with_context(|| format!("writing {}", p.display()))?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_come_from_the_weights_then_imagenet_then_the_index() {
        let imagenet = rn50_data::imagenet_classes();
        let recorded = ["n01440764", "airplane"].map(String::from);
        assert_eq!(
            class_names(Some(&recorded), 2),
            [imagenet[0].to_string(), "airplane".to_string()]
        );
        assert!(imagenet[0].starts_with("n01440764 tench"));
        assert_eq!(class_names(None, 1000)[999], imagenet[999]);
        assert_eq!(class_names(None, 3), ["class 0", "class 1", "class 2"]);
    }
}
