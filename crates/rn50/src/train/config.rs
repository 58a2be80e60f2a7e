//! `rn50 train --config FILE.toml`: a recipe as a file whose keys are train's long flag names (`batch-size = 256`,
//! `no-bn-wd = true`, `lr-milestones = [30, 60]`, `data = "/path"` for DATA). The file becomes command-line flags
//! put before the user's own, then clap parses everything once: the values go through the flags' own parsers and
//! ranges, and a flag given on the command line wins over the file's ([`expand`]); a switch the file turns on is
//! turned off by its negation on the command line ([`with_negations`]: `--no-nesterov`). A value is passed as
//! `--flag=VALUE`, and DATA after `--`, so that no string from the file is read as a flag (`data = "--nesterov"` is
//! the folder `--nesterov`). `overwrite` is refused in a file: replacing a run directory is decided on the command
//! line, each time.
//!
//! [`resolved_flags`] and [`document`] write every flag's value back in the same form, typed as the flag is (a
//! string flag as a TOML string, `--device 007` is `device = "007"`, never the number 7; a path made absolute): the
//! run directory's config.toml, reusable with `--config` from any directory and on any machine. It records what
//! this machine resolved `--device auto`, the default precision and the default memory format (channels_last or
//! not) to, as those flags: another machine runs the same or refuses with the reason (no CUDA device; no bf16 in
//! this CPU). `--threads` and `--workers` are recorded only when given: their defaults are each machine's CPUs. Its `[run]` table ([`RunRecord`], skipped
//! by `--config`) has the processes, global batch and libtorch, which a re-run compares with its own and warns
//! about ([`RunRecord::differences`]). It leaves out `out`: a reused config.toml starts a new run (in runs/train or
//! the --out given), never one in the run directory it was copied from; and `--mllog` with its MLPerf flags: an
//! MLPerf log holds one run.
use std::any::TypeId;
use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Args, Command};
use rn50_args::UsageError;

use crate::device::Compute;
use crate::train::TrainArgs;

/// Flags that are about this invocation, not the recipe: left out of the written config.toml. `out`: the run
/// directory the file was written to is that run's (re-running the file there would be refused as "already
/// holds a run"); `mllog` and its MLPerf submission flags: an MLPerf log holds one run, so the file's log
/// would refuse a re-run.
const NOT_RECIPE: &[&str] = &[
    "config",
    "resume",
    "overwrite",
    "out",
    "mllog",
    "submission_org",
    "submission_platform",
    "submission_division",
    "submission_status",
    "drop_caches",
];

/// The table of config.toml that is no flag: what the run resolved to ([`RunRecord`]).
const RUN_TABLE: &str = "run";

/// Flags a file may not give: decisions for each invocation that a reused config.toml must never make on its own.
const COMMAND_LINE_ONLY: &[&str] = &["overwrite"];

/// Flags that exclude each other: one given on the command line drops the other from the file.
const EXCLUSIVE: &[(&str, &str)] = &[("lr", "lr_base"), ("resume", "overwrite")];

fn train_command() -> Command {
    TrainArgs::augment_args(Command::new("train"))
}

fn find<'a>(cmd: &'a Command, long: &str) -> Option<&'a Arg> {
    cmd.get_arguments().find(|a| {
        a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|al| al.contains(&long))
    })
}

fn find_short(cmd: &Command, short: char) -> Option<&Arg> {
    cmd.get_arguments().find(|a| a.get_short() == Some(short))
}

/// What the user's own `train` arguments set: the flags' ids, whether DATA is there, and --config's value.
#[derive(Default)]
struct Given {
    ids: HashSet<String>,
    data: bool,
    /// Whether the arguments have a `--` (after which everything is DATA).
    dashdash: bool,
    config: Option<OsString>,
}

fn scan(cmd: &Command, args: &[OsString]) -> Given {
    let mut given = Given::default();
    let mut i = 0;
    while i < args.len() {
        let Some(t) = args[i].to_str() else {
            given.data = true;
            i += 1;
            continue;
        };
        let (arg, inline) = if t == "--" {
            given.data |= i + 1 < args.len();
            given.dashdash = true;
            break;
        } else if let Some(long) = t.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (long, None),
            };
            (find(cmd, name), value.is_some())
        } else if let Some(short) = t.strip_prefix('-').and_then(|s| s.chars().next()) {
            (find_short(cmd, short), t.len() > 2)
        } else {
            given.data = true;
            (None, false)
        };
        if let Some(a) = arg {
            let id = a.get_id().as_str();
            given.ids.insert(id.to_string());
            if a.get_action().takes_values() && !inline {
                i += 1;
            }
            if id == "config" {
                given.config = match t.split_once('=') {
                    Some((_, v)) => Some(v.into()),
                    None => args.get(i).cloned(),
                };
            }
        }
        i += 1;
    }
    given
}

/// `argv` (the whole command line, program name first) with the flags of `train --config FILE` inserted before the
/// user's own `train` arguments; any other command line as it is. An unreadable file, a key that is no long flag
/// of train, a command-line-only flag (`overwrite`), or a value of the wrong shape is a [`UsageError`] (exit 2)
/// naming the file and the key. The file's values are `--flag=VALUE` and its DATA comes last, after `--`: no
/// value can be taken for a flag.
pub fn expand(argv: Vec<OsString>) -> Result<Vec<OsString>, UsageError> {
    if argv.get(1).map(OsString::as_os_str) != Some(OsStr::new("train")) {
        return Ok(argv);
    }
    let cmd = train_command();
    let given = scan(&cmd, &argv[2..]);
    let Some(path) = given.config.as_ref() else {
        return Ok(argv);
    };
    let shown = std::path::Path::new(path).display();
    let text =
        std::fs::read_to_string(path).map_err(|e| UsageError(format!("--config {shown}: {e}")))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| UsageError(format!("--config {shown}: {e}")))?;
    let mut file_args: Vec<OsString> = Vec::new();
    let mut file_data: Option<OsString> = None;
    for (key, value) in &table {
        let bad = |why: &str| UsageError(format!("--config {shown}: key `{key}`: {why}"));
        if key == RUN_TABLE && value.is_table() {
            continue;
        }
        if key == "data" {
            let toml::Value::String(data) = value else {
                return Err(bad("DATA must be a string"));
            };
            if !given.data {
                file_data = Some(data.into());
            }
            continue;
        }
        let arg = find(&cmd, key)
            .filter(|a| !a.is_positional() && a.get_id() != "config")
            .ok_or_else(|| {
                bad("no such flag (the keys are `rn50 train`'s long flag names, and `data`)")
            })?;
        let id = arg.get_id().as_str();
        if COMMAND_LINE_ONLY.contains(&id) {
            return Err(bad(&format!(
                "--{id} is given on the command line only, never by a recipe or a reused config.toml"
            )));
        }
        let overridden = given.ids.contains(id)
            || EXCLUSIVE.iter().any(|&(a, b)| {
                (id == a && given.ids.contains(b)) || (id == b && given.ids.contains(a))
            });
        if overridden {
            continue;
        }
        let flag = format!("--{}", arg.get_long().unwrap_or(key));
        if !arg.get_action().takes_values() {
            match value {
                toml::Value::Boolean(true) => file_args.push(flag.into()),
                toml::Value::Boolean(false) => {}
                _ => return Err(bad("a switch: true or false")),
            }
            continue;
        }
        let text = match value {
            toml::Value::Array(items) => items
                .iter()
                .map(scalar)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("a list of numbers or strings"))?
                .join(","),
            v => scalar(v).ok_or_else(|| bad("a number, string or true/false"))?,
        };
        file_args.push(format!("{flag}={text}").into());
    }
    let mut out = argv[..2].to_vec();
    out.extend(file_args);
    out.extend_from_slice(&argv[2..]);
    // DATA last, after a `--` (the user's own, when they ended with one): a positional value, whatever it looks like.
    if let Some(data) = file_data {
        if !given.dashdash {
            out.push("--".into());
        }
        out.push(data);
    }
    Ok(out)
}

/// The name that turns switch `long` off: `no-nesterov` for `nesterov`, `bn-wd` for `no-bn-wd`.
fn negation(long: &str) -> String {
    match long.strip_prefix("no-") {
        Some(rest) => rest.to_string(),
        None => format!("no-{long}"),
    }
}

/// `train` with a hidden switch that turns off each of its switches (`--no-nesterov`, `--bn-wd` for `--no-bn-wd`),
/// the last of the two given winning: how the command line turns off a switch that a `--config` file turns on
/// ([`expand`] puts the file's flags first). A switch that already has its opposite (`--channels-last` and
/// `--no-channels-last`) and the command-line-only `--overwrite` get none. The negations are no flags of their own:
/// config.toml records the switch as false.
pub fn with_negations(cmd: Command) -> Command {
    let negations: Vec<Arg> = cmd
        .get_arguments()
        .filter(|a| {
            matches!(a.get_action(), clap::ArgAction::SetTrue)
                && !a.is_hide_set()
                && !COMMAND_LINE_ONLY.contains(&a.get_id().as_str())
        })
        .filter_map(|a| {
            let long = a.get_long()?;
            let name = negation(long);
            if find(&cmd, &name).is_some() {
                return None;
            }
            Some(
                Arg::new(name.clone())
                    .long(name)
                    .action(clap::ArgAction::SetTrue)
                    .overrides_with(a.get_id())
                    .hide(true),
            )
        })
        .collect();
    cmd.args(negations)
}

fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A flag's value as TOML, typed as the flag's parser is: an integer flag's as an integer (one beyond i64 as a
/// string), a float flag's as a float, a switch's as true/false, a path's as an absolute path (the file is read
/// from anywhere), and every other flag's (names, choices) as a string, however it looks: `--device 007` is
/// `device = "007"`. [`expand`] reads each back to the same value.
fn typed(arg: &Arg, raw: &str) -> toml::Value {
    let t = arg.get_value_parser().type_id();
    let is = |ids: &[TypeId]| ids.iter().any(|id| t == *id);
    let integer = [
        TypeId::of::<u8>(),
        TypeId::of::<u16>(),
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
        TypeId::of::<usize>(),
        TypeId::of::<i8>(),
        TypeId::of::<i16>(),
        TypeId::of::<i32>(),
        TypeId::of::<i64>(),
        TypeId::of::<isize>(),
    ];
    let parsed = if is(&integer) {
        raw.parse::<i64>().ok().map(toml::Value::Integer)
    } else if is(&[TypeId::of::<f64>(), TypeId::of::<f32>()]) {
        raw.parse::<f64>().ok().map(toml::Value::Float)
    } else if is(&[TypeId::of::<bool>()]) {
        raw.parse::<bool>().ok().map(toml::Value::Boolean)
    } else if is(&[TypeId::of::<PathBuf>()]) {
        std::path::absolute(raw)
            .ok()
            .map(|p| toml::Value::String(p.to_string_lossy().into_owned()))
    } else {
        None
    };
    parsed.unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

/// Every `train` flag's value in `matches` (defaults included, unset optional flags left out) as a TOML table
/// that `--config` reads back to the same flags ([`document`] writes it).
pub fn resolved_flags(matches: &ArgMatches) -> toml::Table {
    let cmd = train_command();
    let mut table = toml::Table::new();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        // Hidden flags (main.py's and timm's, refused when given) are no part of a recipe.
        if NOT_RECIPE.contains(&id) || arg.is_hide_set() {
            continue;
        }
        let key = match arg.get_long() {
            Some(long) => long,
            None if arg.is_positional() => "data",
            None => continue,
        };
        // --lr-base's default when --lr is given: left out, as the file could not give both.
        let excluded = EXCLUSIVE.iter().any(|&(a, b)| {
            let partner = if id == a {
                b
            } else if id == b {
                a
            } else {
                return false;
            };
            matches.value_source(id) == Some(ValueSource::DefaultValue)
                && matches
                    .value_source(partner)
                    .is_some_and(|s| s != ValueSource::DefaultValue)
        });
        let Some(raw) = matches.get_raw(id).filter(|_| !excluded) else {
            continue;
        };
        let values: Vec<toml::Value> = raw.map(|v| typed(arg, &v.to_string_lossy())).collect();
        let value = if arg.get_value_delimiter().is_some() {
            toml::Value::Array(values)
        } else {
            match values.into_iter().next() {
                Some(v) => v,
                None => continue,
            }
        };
        table.insert(key.to_string(), value);
    }
    table
}

/// What a run resolved to on its machine, beside its flags: config.toml's `[run]` table.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RunRecord {
    /// Processes (ranks) of the run.
    pub processes: usize,
    /// Images per optimizer step, all processes together.
    pub global_batch: usize,
    /// The device's kind and name: `cuda (NVIDIA H100 80GB HBM3)`, `cpu (AMD EPYC 9B14)`.
    pub device: String,
    pub libtorch: String,
}

impl RunRecord {
    /// The `[run]` table of the config.toml at `path`, if it has one (a recipe of recipes/ has none).
    pub fn of_file(path: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut table: toml::Table = text.parse().ok()?;
        table.remove(RUN_TABLE)?.try_into().ok()
    }

    /// What differs from `earlier` (a reused config.toml's run), one `name: earlier → now` per field; the
    /// re-run then cannot reproduce the earlier run's numbers.
    pub fn differences(&self, earlier: &RunRecord) -> Vec<String> {
        let mut out = Vec::new();
        let mut cmp = |name: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{name} {a} → {b}"));
            }
        };
        cmp(
            "processes",
            earlier.processes.to_string(),
            self.processes.to_string(),
        );
        cmp(
            "global batch",
            earlier.global_batch.to_string(),
            self.global_batch.to_string(),
        );
        cmp("device", earlier.device.clone(), self.device.clone());
        cmp("libtorch", earlier.libtorch.clone(), self.libtorch.clone());
        out
    }
}

/// config.toml's text: the flags, with `--device auto`, a default precision and a default memory format replaced
/// by what `resolved` says this machine chose (`device = "cuda"`, `precision = "fp16"`, `channels-last = true`),
/// then the `[run]` table.
pub fn document(flags: &toml::Table, resolved: Option<(&Compute, &RunRecord)>) -> String {
    let mut table = flags.clone();
    if let Some((compute, run)) = resolved {
        if table.get("device").and_then(toml::Value::as_str) == Some("auto") {
            let kind = if compute.device.is_cuda() {
                "cuda"
            } else {
                "cpu"
            };
            table.insert("device".into(), kind.into());
        }
        table
            .entry("precision")
            .or_insert_with(|| compute.precision.to_string().into());
        // Neither --channels-last nor --no-channels-last given: the one the device (and --width) resolved to.
        let given = |key: &str| table.get(key).and_then(toml::Value::as_bool) == Some(true);
        if !given("channels-last") && !given("no-channels-last") {
            table.insert("channels-last".into(), compute.channels_last.into());
            table.insert("no-channels-last".into(), (!compute.channels_last).into());
        }
        let run = toml::Table::try_from(run).expect("a record of scalars is a TOML table");
        table.insert(RUN_TABLE.into(), run.into());
    }
    let mut text = String::from(
        "# rn50 train: every flag's value as this machine resolved it, and in [run] what it ran on \
         (`rn50 train --config config.toml` runs it again)\n",
    );
    text.push_str(&toml::to_string(&table).expect("a table of scalars and arrays is TOML"));
    text
}
