//! SLURM's compressed host lists (`gpu[01-04,07],cpu3`, `node[001-003]-ib`, `r[1-2]n[1-2]`) and task counts per
//! node (`4(x2),3`).
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("cannot parse {what} {input:?}: {why}")]
pub struct ParseError {
    pub what: &'static str,
    pub input: String,
    pub why: String,
}

fn perr(what: &'static str, input: &str, why: impl Into<String>) -> ParseError {
    ParseError {
        what,
        input: input.into(),
        why: why.into(),
    }
}

/// Splits at commas outside brackets.
fn top_level_items(s: &str) -> Result<Vec<&str>, ParseError> {
    let (mut depth, mut start, mut out) = (0i32, 0usize, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(perr("host list", s, "unbalanced or nested brackets"));
        }
    }
    if depth != 0 {
        return Err(perr("host list", s, "unclosed '['"));
    }
    out.push(&s[start..]);
    Ok(out)
}

/// The values of one bracket body: `01-04,07` → 01 02 03 04 07 (zero padding kept: the width of the lower bound).
fn expand_range(body: &str, whole: &str) -> Result<Vec<String>, ParseError> {
    let mut out = Vec::new();
    for part in body.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((lo, hi)) => {
                let bad = || perr("host list", whole, format!("bad range {part:?}"));
                if lo.is_empty()
                    || !lo.bytes().all(|b| b.is_ascii_digit())
                    || !hi.bytes().all(|b| b.is_ascii_digit())
                {
                    return Err(bad());
                }
                let (a, b): (u64, u64) = (
                    lo.parse().map_err(|_| bad())?,
                    hi.parse().map_err(|_| bad())?,
                );
                if b < a || b - a > 1_000_000 {
                    return Err(bad());
                }
                let width = lo.len();
                out.extend((a..=b).map(|n| format!("{n:0width$}")));
            }
            None if !part.is_empty() => out.push(part.to_string()),
            None => return Err(perr("host list", whole, "empty item in brackets")),
        }
    }
    Ok(out)
}

/// Expands one host pattern with any number of bracket groups (cartesian product, left to right).
fn expand_item(item: &str, whole: &str) -> Result<Vec<String>, ParseError> {
    let mut hosts = vec![String::new()];
    let mut rest = item;
    while let Some(open) = rest.find('[') {
        let close = rest[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or_else(|| perr("host list", whole, "unclosed '['"))?;
        let prefix = &rest[..open];
        let values = expand_range(&rest[open + 1..close], whole)?;
        hosts = hosts
            .iter()
            .flat_map(|h| values.iter().map(move |v| format!("{h}{prefix}{v}")))
            .collect();
        rest = &rest[close + 1..];
    }
    for h in &mut hosts {
        h.push_str(rest);
    }
    Ok(hosts)
}

/// All hosts of a SLURM node list, in order.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, ParseError> {
    let list = list.trim();
    if list.is_empty() {
        return Err(perr("host list", list, "empty"));
    }
    let mut out = Vec::new();
    for item in top_level_items(list)? {
        let item = item.trim();
        if item.is_empty() {
            return Err(perr("host list", list, "empty host name"));
        }
        out.extend(expand_item(item, list)?);
    }
    Ok(out)
}

/// The first host of a SLURM node list (where SLURM starts task 0 with the default block distribution).
pub fn first_host(list: &str) -> Result<String, ParseError> {
    expand_hostlist(list)?
        .into_iter()
        .next()
        .ok_or_else(|| perr("host list", list, "no host"))
}

/// SLURM_TASKS_PER_NODE: `4(x2),3` → [4, 4, 3].
pub fn expand_tasks_per_node(s: &str) -> Result<Vec<usize>, ParseError> {
    let mut out = Vec::new();
    for item in s.trim().split(',') {
        let item = item.trim();
        let bad = || perr("tasks per node", s, format!("bad item {item:?}"));
        let (count, repeat) = match item.split_once('(') {
            Some((c, r)) => {
                let r = r
                    .strip_prefix('x')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(bad)?;
                (c, r.parse::<usize>().map_err(|_| bad())?)
            }
            None => (item, 1),
        };
        let n = count.parse::<usize>().map_err(|_| bad())?;
        if repeat > 1_000_000 {
            return Err(bad());
        }
        out.extend(std::iter::repeat_n(n, repeat));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostlists() {
        assert_eq!(
            expand_hostlist("gpu[01-04,07],cpu3").unwrap(),
            ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"]
        );
        assert_eq!(
            expand_hostlist("node[001-003]-ib").unwrap(),
            ["node001-ib", "node002-ib", "node003-ib"]
        );
        assert_eq!(expand_hostlist("a1").unwrap(), ["a1"]);
        assert_eq!(expand_hostlist("a,b,c").unwrap(), ["a", "b", "c"]);
        assert_eq!(
            expand_hostlist("r[1-2]n[08-09]").unwrap(),
            ["r1n08", "r1n09", "r2n08", "r2n09"]
        );
        assert_eq!(expand_hostlist("n[9-11]").unwrap(), ["n9", "n10", "n11"]);
        assert_eq!(
            expand_hostlist("n[098-101]").unwrap(),
            ["n098", "n099", "n100", "n101"]
        );
        assert_eq!(expand_hostlist("x[5]").unwrap(), ["x5"]);
        assert_eq!(first_host("gpu[01-04,07],cpu3").unwrap(), "gpu01");
        assert_eq!(first_host("cpu3,gpu[01-04]").unwrap(), "cpu3");
        assert_eq!(
            first_host("node-a[10-12].cluster").unwrap(),
            "node-a10.cluster"
        );
    }

    #[test]
    fn bad_hostlists() {
        for bad in [
            "",
            "gpu[01-04",
            "gpu01-04]",
            "gpu[04-01]",
            "gpu[a-b]",
            "gpu[1-]",
            "a,,b",
            "g[[1]]",
            "g[]",
        ] {
            assert!(expand_hostlist(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn tasks_per_node() {
        assert_eq!(expand_tasks_per_node("4(x2),3").unwrap(), [4, 4, 3]);
        assert_eq!(expand_tasks_per_node("2").unwrap(), [2]);
        assert_eq!(expand_tasks_per_node("1,2(x3)").unwrap(), [1, 2, 2, 2]);
        for bad in ["", "x", "4(2)", "4(x)", "4(x2", "-1"] {
            assert!(
                expand_tasks_per_node(bad).is_err(),
                "{bad:?} should not parse"
            );
        }
    }
}
