//! Every rank of a job must run with the same settings. A different batch size (or epoch count, schedule…) on one
//! rank does not fail by itself: the ranks drift out of step (one ends its epoch first and enters another
//! collective) and it surfaces later as a misleading error, a hang or a wrong result. So the ranks compare their
//! resolved configurations through the store at start-up ([`crate::ProcessGroup::check_same_config`]), and a
//! difference is an error that names each flag and the ranks' values.
use crate::health::ranks;
use serde_json::Value;
use std::collections::BTreeMap;

/// `config`'s leaves by dotted path ("compute.device"), as text; the `skip` paths (and what is under them) are
/// left out.
pub fn flatten(config: &Value, skip: &[&str]) -> BTreeMap<String, String> {
    fn walk(v: &Value, path: &str, skip: &[&str], out: &mut BTreeMap<String, String>) {
        if skip.contains(&path) {
            return;
        }
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, v) in m {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(v, &p, skip, out);
                }
            }
            Value::String(s) => {
                out.insert(path.into(), s.clone());
            }
            Value::Null => {
                out.insert(path.into(), "(not set)".into());
            }
            v => {
                out.insert(path.into(), v.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(config, "", skip, &mut out);
    out
}

/// The command-line flag of a configuration path: its last part with dashes ("compute.no_fused_bn" →
/// "--no-fused-bn"), as clap derives long flags from field names.
fn flag(path: &str) -> String {
    let leaf = path.rsplit('.').next().unwrap_or(path);
    format!("--{}", leaf.replace('_', "-"))
}

/// "rank 1", "ranks 0, 2", or for many "120 ranks (0, 1, 2, 3, …)".
fn some_ranks(rs: &[usize]) -> String {
    if rs.len() <= 6 {
        return ranks(rs);
    }
    let first: Vec<String> = rs.iter().take(4).map(|r| r.to_string()).collect();
    format!("{} ranks ({}, …)", rs.len(), first.join(", "))
}

/// What differs between the ranks' settings (`all[r]` is rank r's [`flatten`]ed configuration), as one sentence
/// naming each flag and which ranks have which value; None when every rank has the same.
pub fn differences(all: &[BTreeMap<String, String>]) -> Option<String> {
    let paths: std::collections::BTreeSet<&String> = all.iter().flat_map(|c| c.keys()).collect();
    let mut parts = Vec::new();
    for path in paths {
        // The distinct values in order of the first rank that has each.
        let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
        for (r, c) in all.iter().enumerate() {
            let v = c.get(path).map_or("(absent)", String::as_str);
            match groups.iter_mut().find(|(g, _)| *g == v) {
                Some((_, rs)) => rs.push(r),
                None => groups.push((v, vec![r])),
            }
        }
        if groups.len() > 1 {
            let values: Vec<String> = groups
                .iter()
                .map(|(v, rs)| {
                    let verb = if rs.len() == 1 { "has" } else { "have" };
                    format!("{} {verb} {v}", some_ranks(rs))
                })
                .collect();
            parts.push(format!("{}: {}", flag(path), values.join(", ")));
        }
    }
    (!parts.is_empty()).then(|| {
        format!(
            "the ranks were started with different settings (every rank must run the same command): {}",
            parts.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flattens_nested_settings_and_leaves_out_skipped_ones() {
        let c = json!({"batch_size": 256, "lr": 0.1, "resume": null, "out": "runs/a",
                       "compute": {"device": "cuda:1", "no_fused_bn": false}, "workers": 8});
        let f = flatten(&c, &["workers", "compute.device"]);
        let want: BTreeMap<String, String> = [
            ("batch_size", "256"),
            ("lr", "0.1"),
            ("resume", "(not set)"),
            ("out", "runs/a"),
            ("compute.no_fused_bn", "false"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(f, want);
    }

    #[test]
    fn names_each_differing_flag_with_the_ranks_values() {
        let a = flatten(
            &json!({"batch_size": 1, "lr": 0.1, "compute": {"no_fused_bn": false}}),
            &[],
        );
        let b = flatten(
            &json!({"batch_size": 2, "lr": 0.1, "compute": {"no_fused_bn": true}}),
            &[],
        );
        assert_eq!(differences(&[a.clone(), a.clone(), a.clone()]), None);
        assert_eq!(
            differences(&[a.clone(), b, a.clone()]).unwrap(),
            "the ranks were started with different settings (every rank must run the same command): \
             --batch-size: ranks 0, 2 have 1, rank 1 has 2; --no-fused-bn: ranks 0, 2 have false, rank 1 has true"
        );
        let mut many = vec![a.clone(); 9];
        many[7].remove("lr");
        assert_eq!(
            differences(&many).unwrap(),
            "the ranks were started with different settings (every rank must run the same command): \
             --lr: 8 ranks (0, 1, 2, 3, …) have 0.1, rank 7 has (absent)"
        );
    }
}
