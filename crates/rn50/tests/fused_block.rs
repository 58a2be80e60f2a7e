//! The bottleneck with its batch norms folded into its convolutions (`crates/shim/cpp/fused_block.cpp`): its body
//! (conv1 to conv3, bn1 and bn2) followed by the tail in PyTorch's ops, and the whole block (the tail, bn3 and the
//! projection's batch norm, folded too), against PyTorch autograd of the plain block (conv → batch_norm(training) →
//! ReLU ×3, the shortcut, add, ReLU) on the same inputs: output, the input gradient, every parameter gradient and
//! the running statistics.
//!
//! On the CPU the body runs its stages as ATen ops (the decomposition: statistics from the convolution's output,
//! batch norm finalized into a scale and bias, the activation recomputed from the raw convolution output in the
//! next convolution and in backward, the batch-norm input gradient as three per-channel coefficients), in fp32,
//! where it must match the plain block to rounding. On a GPU (tests marked ignored, run with `--include-ignored`
//! on a GPU machine, failing without one) each stage is its cuDNN graph, checked in fp16/bf16 against fp32.
mod common;

use common::{assert_as_close_as_peer, l2_rel_err};
use rn50::model::{fused, memory_format, Arch, Model, ResNetConfig};
use rn50::shim::{self, BlockReach, Fused};
use tch::{Device, Kind, Reduction, Tensor};

const MOMENTUM: f64 = 0.1;
const EPS: f64 = 1e-5;

/// One bottleneck's tensors, fp32 leaves: the conv weights (conv1, conv2, conv3, downsample), then γ, β of each
/// batch norm; and each batch norm's running mean and variance. As `ResNet`'s blocks hand them to the shim.
struct Block {
    params: Vec<Tensor>,
    stride: i64,
    downsample: bool,
    /// ResNet-D's shortcut: a 2x2 average pool (ceil mode, padding not counted), then the conv at stride 1.
    avg_down: bool,
}

impl Block {
    fn new(cin: i64, planes: i64, stride: i64, dev: Device) -> Block {
        let cout = 4 * planes;
        let downsample = stride != 1 || cin != cout;
        let leaf = |t: Tensor| t.set_requires_grad(true);
        let conv = |co: i64, ci: i64, k: i64| {
            leaf(
                Tensor::randn([co, ci, k, k], (Kind::Float, dev))
                    * (2.0 / (ci * k * k) as f64).sqrt(),
            )
        };
        let mut params = vec![
            conv(planes, cin, 1),
            conv(planes, planes, 3),
            conv(cout, planes, 1),
        ];
        if downsample {
            params.push(conv(cout, cin, 1));
        }
        for c in [planes, planes, cout, cout]
            .into_iter()
            .take(if downsample { 4 } else { 3 })
        {
            params.push(leaf(Tensor::rand([c], (Kind::Float, dev)) + 0.5));
            params.push(leaf(Tensor::randn([c], (Kind::Float, dev)) * 0.2));
        }
        Block {
            params,
            stride,
            downsample,
            avg_down: false,
        }
    }

    /// What the shortcut's conv reads, and at which stride.
    fn shortcut_input(&self, x: &Tensor) -> (Tensor, i64) {
        if self.avg_down && self.stride != 1 {
            let pooled = x.avg_pool2d([2, 2], [2, 2], [0, 0], true, false, None::<i64>);
            return (pooled, 1);
        }
        (x.shallow_clone(), self.stride)
    }

    /// The shortcut branch in PyTorch ops, in `kind`: the input, or bn(conv(input)).
    fn shortcut(&self, x: &Tensor, buffers: &[Tensor], kind: Kind) -> Tensor {
        if !self.downsample {
            return x.shallow_clone();
        }
        let (input, stride) = self.shortcut_input(x);
        let y = input.conv2d(
            &self.params[3].to_kind(kind),
            None::<Tensor>,
            [stride; 2],
            [0, 0],
            [1, 1],
            1,
        );
        self.batch_norm(&y, buffers, 3).to_kind(kind)
    }

    fn convs(&self) -> usize {
        if self.downsample {
            4
        } else {
            3
        }
    }

    /// Fresh running statistics (mean 0.1, var 1.5, as a partly trained network has), one pair per batch norm.
    fn buffers(&self) -> Vec<Tensor> {
        let dev = self.params[0].device();
        (0..self.convs())
            .flat_map(|i| {
                let c = self.params[i].size()[0];
                [
                    Tensor::full([c], 0.1, (Kind::Float, dev)),
                    Tensor::full([c], 1.5, (Kind::Float, dev)),
                ]
            })
            .collect()
    }

    /// Batch norm `i` (bn1, bn2, bn3, downsample) in training, PyTorch's op, updating `buffers`.
    fn batch_norm(&self, y: &Tensor, buffers: &[Tensor], i: usize) -> Tensor {
        let (p, n) = (&self.params, self.convs());
        y.batch_norm(
            Some(&p[n + 2 * i]),
            Some(&p[n + 2 * i + 1]),
            Some(&buffers[2 * i]),
            Some(&buffers[2 * i + 1]),
            true,
            MOMENTUM,
            EPS,
            false,
        )
    }

    /// The plain block in PyTorch ops, in `kind` (weights cast as autocast would), recorded by autograd.
    fn reference(&self, x: &Tensor, buffers: &[Tensor], kind: Kind) -> Tensor {
        let p = &self.params;
        let conv = |x: &Tensor, i: usize, stride: i64, pad: i64| {
            x.conv2d(
                &p[i].to_kind(kind),
                None::<Tensor>,
                [stride; 2],
                [pad; 2],
                [1, 1],
                1,
            )
        };
        let bn = |y: &Tensor, i: usize| self.batch_norm(y, buffers, i).to_kind(kind);
        let a1 = bn(&conv(x, 0, 1, 0), 0).relu();
        let a2 = bn(&conv(&a1, 1, self.stride, 1), 1).relu();
        let y3 = bn(&conv(&a2, 2, 1, 0), 2);
        (y3 + self.shortcut(x, buffers, kind)).relu()
    }

    /// The fused body's output (`shim::bottleneck`, given conv1 to conv3, bn1 and bn2 as the ResNet hands them).
    fn body(&self, x: &Tensor, buffers: &[Tensor], use_graph: bool, momentum: f64) -> Fused {
        let (p, n) = (&self.params, self.convs());
        let body: Vec<Tensor> = p[..3]
            .iter()
            .chain(&p[n..n + 4])
            .map(Tensor::shallow_clone)
            .collect();
        shim::bottleneck(
            x,
            BlockReach::Body,
            &body,
            &buffers[..4],
            self.stride,
            momentum,
            EPS,
            use_graph,
        )
        .unwrap()
    }

    /// The block with its body fused (`shim::bottleneck`: conv1 to conv3, bn1 and bn2, as the ResNet hands it over)
    /// and the tail in PyTorch's ops, in the body's output type.
    fn fused(&self, x: &Tensor, buffers: &[Tensor], use_graph: bool, momentum: f64) -> Tensor {
        let y3 = match self.body(x, buffers, use_graph, momentum) {
            Fused::Done(y) => y,
            Fused::NotApplicable(why) => panic!("the fused body declined: {why}"),
        };
        let kind = y3.kind();
        let y3 = self.batch_norm(&y3, buffers, 2).to_kind(kind);
        (y3 + self.shortcut(x, buffers, kind)).relu()
    }

    /// The whole block through `shim::bottleneck`, its tail (bn3, the projection's batch norm, add, ReLU) folded
    /// too, given every tensor as the ResNet hands them over.
    fn whole(&self, x: &Tensor, buffers: &[Tensor], use_graph: bool, momentum: f64) -> Fused {
        let (input, stride) = self.shortcut_input(x);
        let reach = if self.downsample {
            BlockReach::Projection {
                input: &input,
                stride,
            }
        } else {
            BlockReach::Identity(x)
        };
        shim::bottleneck(
            x,
            reach,
            &self.params,
            buffers,
            self.stride,
            momentum,
            EPS,
            use_graph,
        )
        .unwrap()
    }

    /// [`Block::whole`]'s output, which must not decline.
    fn folded(&self, x: &Tensor, buffers: &[Tensor], use_graph: bool, momentum: f64) -> Tensor {
        match self.whole(x, buffers, use_graph, momentum) {
            Fused::Done(y) => y,
            Fused::NotApplicable(why) => panic!("the fused block declined: {why}"),
        }
    }
}

/// What one forward/backward gives: output, gradients of the input and of every parameter, running statistics.
struct Outcome {
    out: Tensor,
    grads: Vec<(String, Tensor)>,
    running: Vec<Tensor>,
}

/// Runs `forward` on a fresh copy of `x` and of the running statistics, back-propagates `weight · out` summed, and
/// collects everything, the parameter gradients cleared afterwards.
fn outcome(
    block: &Block,
    x: &Tensor,
    weight: &Tensor,
    forward: impl Fn(&Tensor, &[Tensor]) -> Tensor,
) -> Outcome {
    let x = x.detach().copy().set_requires_grad(true);
    let running = block.buffers();
    let out = forward(&x, &running);
    (out.to_kind(Kind::Float) * weight)
        .sum(Kind::Float)
        .backward();
    let mut grads = vec![("input".to_string(), x.grad().to_kind(Kind::Float))];
    for (i, p) in block.params.iter().enumerate() {
        grads.push((format!("param {i}"), p.grad().copy()));
        let mut g = p.grad();
        let _ = g.zero_();
    }
    Outcome {
        out: out.detach().to_kind(Kind::Float),
        grads,
        running,
    }
}

/// Every quantity of `got` within `tol` of `want`, or (with `peer`, the same computation in PyTorch's ops in the
/// same low precision) no further from it than 1.5 times the peer is.
fn compare(case: &str, got: &Outcome, want: &Outcome, peer: Option<&Outcome>, tol: f64) {
    let judge = |what: &str, g: &Tensor, w: &Tensor, p: Option<&Tensor>| {
        assert_as_close_as_peer(&format!("{case}: {what}"), g, w, p, tol)
    };
    judge("output", &got.out, &want.out, peer.map(|p| &p.out));
    for (i, (name, g)) in got.grads.iter().enumerate() {
        judge(
            &format!("gradient of {name}"),
            g,
            &want.grads[i].1,
            peer.map(|p| &p.grads[i].1),
        );
    }
    for (i, r) in got.running.iter().enumerate() {
        let what = format!(
            "running {} {}",
            if i % 2 == 0 { "mean" } else { "var" },
            i / 2
        );
        judge(&what, r, &want.running[i], peer.map(|p| &p.running[i]));
    }
}

/// The decomposition in ATen ops equals the plain block on the CPU in fp32, the body alone (the tail in PyTorch's
/// ops) and the whole block (the tail folded too): with and without a downsample, stride 1 and 2 (odd sides, where
/// the strided convolution drops a row), ResNet-D's average-pooled shortcut, NCHW and channels_last.
#[test]
fn decomposition_matches_pytorch_autograd_of_the_plain_block() {
    let cases = [
        // (cin, planes, stride, side, avg_down)
        (16, 4, 1, 8, false), // identity shortcut
        (8, 4, 1, 8, false),  // downsample at stride 1 (the first block of layer1)
        (16, 8, 2, 9, false), // downsample at stride 2, odd side
        (32, 8, 1, 5, false), // identity, odd side
        (16, 8, 2, 9, true),  // ResNet-D's shortcut, odd side (the pool's ceil mode)
    ];
    for (cin, planes, stride, side, avg_down) in cases {
        for channels_last in [false, true] {
            tch::manual_seed(3);
            let case = format!(
                "cin {cin} planes {planes} stride {stride} side {side} avg_down {avg_down} channels_last {channels_last}"
            );
            let mut block = Block::new(cin, planes, stride, Device::Cpu);
            block.avg_down = avg_down;
            let mut x = Tensor::randn([4, cin, side, side], (Kind::Float, Device::Cpu)).relu();
            if channels_last {
                x = memory_format::channels_last(&x);
            }
            let out_side = (side - 1) / stride + 1;
            let weight = Tensor::randn(
                [4, 4 * planes, out_side, out_side],
                (Kind::Float, Device::Cpu),
            );
            let want = outcome(&block, &x, &weight, |x, b| {
                block.reference(x, b, Kind::Float)
            });
            // The CPU has no cuDNN graphs: asking for them runs the same ATen stages.
            for use_graph in [false, true] {
                let body = outcome(&block, &x, &weight, |x, b| {
                    block.fused(x, b, use_graph, MOMENTUM)
                });
                compare(
                    &format!("{case} body, graphs asked {use_graph}"),
                    &body,
                    &want,
                    None,
                    1e-5,
                );
                let whole = outcome(&block, &x, &weight, |x, b| {
                    block.folded(x, b, use_graph, MOMENTUM)
                });
                compare(
                    &format!("{case} whole block, graphs asked {use_graph}"),
                    &whole,
                    &want,
                    None,
                    1e-5,
                );
            }
        }
    }
}

/// The check can fail: a decomposition that got the batch-norm input gradient wrong (here: the plain block with
/// its running statistics' momentum changed, standing for any stage off by a little) is caught.
#[test]
fn the_comparison_catches_a_stage_that_is_off() {
    tch::manual_seed(5);
    let block = Block::new(8, 4, 2, Device::Cpu);
    let x = Tensor::randn([4, 8, 8, 8], (Kind::Float, Device::Cpu)).relu();
    let weight = Tensor::randn([4, 16, 4, 4], (Kind::Float, Device::Cpu));
    let want = outcome(&block, &x, &weight, |x, b| {
        block.reference(x, b, Kind::Float)
    });
    for whole in [false, true] {
        let off = outcome(&block, &x, &weight, |x, b| {
            if whole {
                block.folded(x, b, false, 0.2)
            } else {
                block.fused(x, b, false, 0.2)
            }
        });
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            compare("momentum 0.2", &off, &want, None, 1e-5)
        }));
        assert!(
            caught.is_err(),
            "a block whose running statistics are off passed (whole block: {whole})"
        );
    }
}

/// The block declines what is not a bottleneck's set of tensors, leaving the caller to run the separate ops, and
/// refuses a shortcut whose shape is not the body's output's.
#[test]
fn the_block_declines_what_it_does_not_apply_to() {
    let block = Block::new(16, 4, 1, Device::Cpu);
    let x = Tensor::randn([2, 16, 4, 4], (Kind::Float, Device::Cpu));
    let buffers = block.buffers();
    let call = |reach, params: &[Tensor], buffers: &[Tensor]| {
        shim::bottleneck(&x, reach, params, buffers, 1, MOMENTUM, EPS, false)
    };
    let declined = |r: anyhow::Result<Fused>, what: &str| {
        assert!(matches!(r.unwrap(), Fused::NotApplicable(ref why) if why.contains(what)))
    };
    declined(
        call(BlockReach::Body, &block.params[..5], &buffers[..4]),
        "bottleneck's parameters",
    );
    declined(
        call(BlockReach::Body, &block.params[..7], &buffers),
        "running statistics",
    );
    declined(
        call(BlockReach::Identity(&x), &block.params, &buffers[..4]),
        "running statistics",
    );
    let half = x.slice(2, 0, 2, 1);
    let err = call(BlockReach::Identity(&half), &block.params, &buffers)
        .err()
        .expect("a shortcut of another shape was taken");
    assert!(err.to_string().contains("the shortcut gives"), "{err:#}");
}

/// The GPU of a test marked `#[ignore]` (GPU only): asked to run without one, it fails rather than pass unrun.
fn gpu() -> Device {
    assert!(
        shim::cuda_compiled(),
        "this binary was built without CUDA (a CPU-only libtorch, or no CUDA headers)"
    );
    assert!(
        shim::block_graphs_compiled(),
        "this binary was built without the cuDNN frontend headers"
    );
    assert!(tch::Cuda::is_available(), "no CUDA device visible");
    Device::Cuda(0)
}

/// Each of ResNet-50's bottleneck kinds at a reduced batch, fp16 and bf16, channels_last: the block through cuDNN
/// graphs against the plain block in fp32 on the same inputs (values exact in the low precision), within the
/// error of PyTorch's own ops in that precision. Prints which stages fell back to ATen ops.
#[test]
#[ignore = "needs a CUDA GPU (and rn50 built against a CUDA libtorch): run with --include-ignored there"]
fn cudnn_graph_stages_match_the_plain_block_on_a_gpu() {
    let dev = gpu();
    // (cin, planes, stride, side, avg_down): layer1.0, layer1.1, layer2.0, layer3.1, layer4.0 of ResNet-50, and
    // layer2.0 of ResNet-D.
    let cases = [
        (64, 64, 1, 56, false),
        (256, 64, 1, 56, false),
        (256, 128, 2, 56, false),
        (1024, 256, 1, 14, false),
        (1024, 512, 2, 14, false),
        (256, 128, 2, 56, true),
    ];
    for kind in [Kind::Half, Kind::BFloat16] {
        let tol = if kind == Kind::Half { 5e-3 } else { 4e-2 };
        for (cin, planes, stride, side, avg_down) in cases {
            tch::manual_seed(11);
            let case = format!(
                "{kind:?} cin {cin} planes {planes} stride {stride} side {side} avg_down {avg_down}"
            );
            let mut block = Block::new(cin, planes, stride, dev);
            block.avg_down = avg_down;
            let x = memory_format::channels_last(
                &Tensor::randn([32, cin, side, side], (Kind::Float, dev))
                    .relu()
                    .to_kind(kind),
            );
            // cuDNN 9.19 on an H200 has none of the body's graphs for bf16: the body declines and the block
            // runs the per-layer path, which is what the test then requires.
            if let Fused::NotApplicable(why) = block.body(&x, &block.buffers(), true, MOMENTUM) {
                assert_eq!(
                    kind,
                    Kind::BFloat16,
                    "{case}: the fused body declined: {why}"
                );
                println!("{case}: declined ({why})");
                continue;
            }
            let out_side = (side - 1) / stride + 1;
            let weight = Tensor::randn([32, 4 * planes, out_side, out_side], (Kind::Float, dev));
            let want = outcome(&block, &x, &weight, |x, b| {
                block.reference(&x.to_kind(Kind::Float), b, Kind::Float)
            });
            let peer = outcome(&block, &x, &weight, |x, b| block.reference(x, b, kind));
            let graph = outcome(&block, &x, &weight, |x, b| {
                block.fused(x, b, true, MOMENTUM)
            });
            for line in shim::block_report() {
                println!("{case}: {line}");
            }
            assert_eq!(graph.out.size(), want.out.size());
            compare(&case, &graph, &want, Some(&peer), tol);
            let aten = outcome(&block, &x, &weight, |x, b| {
                block.fused(x, b, false, MOMENTUM)
            });
            compare(
                &format!("{case} (ATen stages)"),
                &aten,
                &want,
                Some(&peer),
                tol,
            );
            println!(
                "{case}: output off fp32 by {:.2e} (graphs), {:.2e} (ATen stages), {:.2e} (PyTorch's ops)",
                l2_rel_err(&graph.out, &want.out),
                l2_rel_err(&aten.out, &want.out),
                l2_rel_err(&peer.out, &want.out)
            );
            // The whole block, its tail folded too (bn3 and the projection's batch norm): the fp16 graphs are
            // required, as the body's are.
            if let Fused::NotApplicable(why) = block.whole(&x, &block.buffers(), true, MOMENTUM) {
                assert_eq!(
                    kind,
                    Kind::BFloat16,
                    "{case}: the fused block declined: {why}"
                );
                println!("{case}: the whole block declined ({why})");
                continue;
            }
            let whole = outcome(&block, &x, &weight, |x, b| {
                block.folded(x, b, true, MOMENTUM)
            });
            compare(
                &format!("{case} (whole block)"),
                &whole,
                &want,
                Some(&peer),
                tol,
            );
            let whole_aten = outcome(&block, &x, &weight, |x, b| {
                block.folded(x, b, false, MOMENTUM)
            });
            compare(
                &format!("{case} (whole block, ATen stages)"),
                &whole_aten,
                &want,
                Some(&peer),
                tol,
            );
            println!(
                "{case}: whole block's output off fp32 by {:.2e} (graphs), {:.2e} (ATen stages)",
                l2_rel_err(&whole.out, &want.out),
                l2_rel_err(&whole_aten.out, &want.out)
            );
        }
    }
}

/// A whole ResNet-50 forward/backward in fp16 AMP (channels_last; zero-initialised residual γ, so that fp32 is a
/// meaningful reference for the gradients) three ways from the same weights and batch: the fused blocks, the per-layer fused batch norm (today's path), and fp32. The fused blocks' loss, gradients and
/// running statistics must be as close to fp32 as the per-layer path's are.
#[test]
#[ignore = "needs a CUDA GPU (and rn50 built against a CUDA libtorch): run with --include-ignored there"]
fn resnet50_with_fused_blocks_trains_as_the_per_layer_path() {
    let dev = gpu();
    shim::set_tf32(false).unwrap();
    const SCALE: f64 = 1024.0;
    tch::manual_seed(0);
    let mut cfg = ResNetConfig::new(Arch::ResNet50);
    cfg.zero_init_residual = true;
    let model = Model::new(cfg, dev);
    model.to_channels_last();
    let x = memory_format::channels_last(&Tensor::randn([32, 3, 224, 224], (Kind::Float, dev)));
    let labels = Tensor::randint(1000, [32], (Kind::Int64, dev));
    let start: Vec<Tensor> = model.state().iter().map(|(_, t)| t.copy()).collect();
    let flat =
        |v: &[Tensor]| Tensor::cat(&v.iter().map(|t| t.flatten(0, -1)).collect::<Vec<_>>(), 0);
    let run = |precision: Option<Kind>, block: bool| {
        tch::no_grad(|| {
            for ((_, mut t), s) in model.state().into_iter().zip(&start) {
                t.copy_(s);
            }
        });
        fused::set_enabled(precision.is_some());
        fused::set_block_enabled(block);
        let loss = {
            let _autocast = precision.map(|k| shim::Autocast::enter(dev, k).unwrap());
            model.forward_t(&x, true).cross_entropy_loss(
                &labels,
                None::<Tensor>,
                Reduction::Mean,
                -100,
                0.0,
            )
        };
        let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
        let grads: Vec<Tensor> = Tensor::run_backward(&[&loss * SCALE], &params, false, false)
            .into_iter()
            .map(|g| g.to_kind(Kind::Float) / SCALE)
            .collect();
        fused::set_enabled(false);
        fused::set_block_enabled(false);
        (
            f64::try_from(&loss).unwrap(),
            flat(&grads),
            flat(&model.buffers()),
        )
    };
    let (loss_b, grads_b, stats_b) = run(Some(Kind::Half), true);
    for line in shim::block_report() {
        println!("{line}");
    }
    let (loss_l, grads_l, stats_l) = run(Some(Kind::Half), false);
    let (loss_r, grads_r, stats_r) = run(None, false);
    let (lb, ll) = ((loss_b - loss_r).abs(), (loss_l - loss_r).abs());
    let (gb, gl) = (
        l2_rel_err(&grads_b, &grads_r),
        l2_rel_err(&grads_l, &grads_r),
    );
    let (sb, sl) = (
        l2_rel_err(&stats_b, &stats_r),
        l2_rel_err(&stats_l, &stats_r),
    );
    println!(
        "off fp32, fused blocks vs per-layer: loss {lb:.2e} vs {ll:.2e}, gradients {gb:.2e} vs {gl:.2e}, running statistics {sb:.2e} vs {sl:.2e}"
    );
    assert!(
        lb < 1e-3 * loss_r.abs() || lb <= 1.5 * ll,
        "loss {loss_b} (blocks) {loss_l} (per-layer) {loss_r} (fp32)"
    );
    assert!(
        gb <= 1.5 * gl + 1e-3,
        "gradients off fp32 by {gb:.2e} (blocks), {gl:.2e} (per-layer)"
    );
    assert!(
        sb <= 1.5 * sl + 1e-4,
        "running statistics off fp32 by {sb:.2e} (blocks), {sl:.2e} (per-layer)"
    );
}
