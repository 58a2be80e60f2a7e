//! The table `rn50 bench --profile` prints of a [`ProfileReport`]: milliseconds per step and share by kind of
//! work, the largest unclassified ops under "other", and the total against the wall time.
use super::{ProfileReport, ProfileSource, WorkKind};

/// The table `rn50 bench --profile` prints.
pub fn render(p: &ProfileReport) -> String {
    let what = match p.source {
        ProfileSource::CpuOps => "CPU op self time",
        ProfileSource::CudaKernels => "GPU kernel time",
    };
    let mut s = format!(
        "profile: {} extra step{} after the measured ones, {what} (profiling slows steps; img/s above is unprofiled)\n",
        p.steps,
        if p.steps == 1 { "" } else { "s" }
    );
    if let Some(n) = &p.note {
        s += &format!("  note: {n}\n");
    }
    s += &format!("  {:<44}{:>10}{:>8}\n", "kind", "ms/step", "share");
    for k in &p.kinds {
        if k.ms_per_step == 0.0 && k.kind != WorkKind::Other {
            continue;
        }
        s += &format!(
            "  {:<44}{:>10.2}{:>7.1}%\n",
            k.kind.name(),
            k.ms_per_step,
            100.0 * k.share
        );
        if k.kind == WorkKind::Other {
            for o in &p.other_top {
                let name: String = if o.name.chars().count() > 40 {
                    o.name.chars().take(39).chain(['…']).collect()
                } else {
                    o.name.clone()
                };
                s += &format!(
                    "    {:<42}{:>10.2}{:>7.1}%\n",
                    name,
                    o.ms_per_step,
                    100.0 * o.share
                );
            }
        }
    }
    let covered = match p.source {
        ProfileSource::CpuOps => "in ops",
        ProfileSource::CudaKernels => "GPU busy, streams may overlap",
    };
    s += &format!(
        "  {:<44}{:>10.2}{:>7.1}%   (wall {:.2} ms/step; {:.0}% {covered})\n",
        "total",
        p.total_ms_per_step,
        100.0,
        p.wall_ms_per_step,
        if p.wall_ms_per_step > 0.0 {
            100.0 * p.total_ms_per_step / p.wall_ms_per_step
        } else {
            0.0
        }
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::profile::{KindTime, NameTime};

    #[test]
    fn the_table_shows_kinds_with_time_and_other_s_largest_ops() {
        let kind = |kind, ms_per_step, share| KindTime {
            kind,
            ms_per_step,
            share,
        };
        let p = ProfileReport {
            source: ProfileSource::CpuOps,
            steps: 2,
            wall_ms_per_step: 20.0,
            total_ms_per_step: 10.0,
            kinds: vec![
                kind(WorkKind::Convolution, 8.0, 0.8),
                kind(WorkKind::BatchNorm, 0.0, 0.0),
                kind(WorkKind::Other, 2.0, 0.2),
            ],
            other_top: vec![NameTime {
                name: "aten::linear".into(),
                ms_per_step: 2.0,
                share: 0.2,
            }],
            events: 7,
            note: None,
        };
        let s = render(&p);
        assert!(s.starts_with("profile: 2 extra steps"), "{s}");
        assert!(s.contains("convolution"), "{s}");
        assert!(!s.contains(WorkKind::BatchNorm.name()), "{s}");
        assert!(s.contains("    aten::linear"), "{s}");
        assert!(s.contains("(wall 20.00 ms/step; 50% in ops)"), "{s}");
    }
}
