//! Scaling efficiency as the HPC sites define it.
//!
//! Time-based (Kempner, NCSA HAL): the same job on N workers against 1, `T1 / (N · TN)`.
//! Throughput-based: `X_N / (N · X_1)`.
//! When the baseline is not one worker (HAL starts at 2), both generalise to per-worker terms against the
//! baseline's: `(b · T_b) / (N · T_N)` and `(X_N / N) / (X_b / b)`.
//! Every function returns None for inputs that give no meaningful number (zero workers, non-positive or
//! non-finite times or rates), so a report shows "—" instead of inf or NaN.

fn ok(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

/// `T1 / (N · TN)`: T1 the wall-clock time on one worker, TN on N.
pub fn time_efficiency(t1: f64, n: u64, tn: f64) -> Option<f64> {
    time_efficiency_from(1, t1, n, tn)
}

/// `(b · T_b) / (N · T_N)`: baseline of `b` workers taking `t_base`, N workers taking `tn`.
pub fn time_efficiency_from(b: u64, t_base: f64, n: u64, tn: f64) -> Option<f64> {
    (b > 0 && n > 0 && ok(t_base) && ok(tn)).then(|| (b as f64 * t_base) / (n as f64 * tn))
}

/// `X_N / (N · X_1)`: X in images per second, all workers together.
pub fn throughput_efficiency(x1: f64, n: u64, xn: f64) -> Option<f64> {
    throughput_efficiency_from(1, x1, n, xn)
}

/// `(X_N / N) / (X_b / b)`.
pub fn throughput_efficiency_from(b: u64, x_base: f64, n: u64, xn: f64) -> Option<f64> {
    (b > 0 && n > 0 && ok(x_base) && ok(xn)).then(|| (xn / n as f64) / (x_base / b as f64))
}

/// `T_b / T_N` for time, the factor by which N workers finished sooner than the baseline.
pub fn speedup_time(t_base: f64, tn: f64) -> Option<f64> {
    (ok(t_base) && ok(tn)).then(|| t_base / tn)
}

/// `X_N / X_b`.
pub fn speedup_throughput(x_base: f64, xn: f64) -> Option<f64> {
    (ok(x_base) && ok(xn)).then(|| xn / x_base)
}

/// The N-worker time implied by a published efficiency: `TN = T1 / (N · e)`.
pub fn time_at_efficiency(t1: f64, n: u64, efficiency: f64) -> Option<f64> {
    (n > 0 && ok(t1) && ok(efficiency)).then(|| t1 / (n as f64 * efficiency))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Option<f64>, b: f64) {
        let a = a.expect("a value");
        assert!((a - b).abs() < 1e-9, "{a} != {b}");
    }

    #[test]
    fn perfect_and_half() {
        close(time_efficiency(100.0, 4, 25.0), 1.0);
        close(time_efficiency(100.0, 4, 50.0), 0.5);
        close(throughput_efficiency(1000.0, 8, 8000.0), 1.0);
        close(throughput_efficiency(1000.0, 8, 6000.0), 0.75);
    }

    #[test]
    fn kempner_76_8_percent_at_64() {
        // 90 epochs on 1 A100 in 36 h; 76.8 % at 64 GPUs means 36 / (64 · 0.768) = 0.732421875 h (43.9 min).
        let t64 = time_at_efficiency(36.0, 64, 0.768).unwrap();
        assert!((t64 - 0.732_421_875).abs() < 1e-12);
        close(time_efficiency(36.0, 64, 0.732_421_875), 0.768);
        // Same through throughput: images/epoch cancel.
        let imgs = 1_281_167.0 * 90.0;
        close(
            throughput_efficiency(imgs / (36.0 * 3600.0), 64, imgs / (t64 * 3600.0)),
            0.768,
        );
    }

    #[test]
    fn hal_2_to_64_v100() {
        // 2 GPUs 20.6 h, 64 GPUs 1.13 h: (2 · 20.6) / (64 · 1.13) = 20.6 / (32 · 1.13) = 20.6 / 36.16.
        let e = time_efficiency_from(2, 20.6, 64, 1.13).unwrap();
        close(Some(e), 20.6 / 36.16);
        assert!((e - 0.569_690).abs() < 1e-6, "{e}");
        close(speedup_time(20.6, 1.13), 18.230_088_495_575_22);
        // Throughput form agrees: X ∝ 1/T.
        close(throughput_efficiency_from(2, 1.0 / 20.6, 64, 1.0 / 1.13), e);
    }

    #[test]
    fn bad_inputs_give_none() {
        assert_eq!(time_efficiency(1.0, 0, 1.0), None);
        assert_eq!(time_efficiency(0.0, 2, 1.0), None);
        assert_eq!(time_efficiency(1.0, 2, f64::NAN), None);
        assert_eq!(throughput_efficiency(-1.0, 2, 1.0), None);
        assert_eq!(throughput_efficiency_from(0, 1.0, 2, 1.0), None);
        assert_eq!(speedup_throughput(0.0, 1.0), None);
        assert_eq!(time_at_efficiency(1.0, 4, 0.0), None);
    }
}
