//! Every example command line in every `--help` parses (issue 14): a flag renamed or removed, or an example written
//! with a flag that never existed (`launch -- train --data …`), fails here instead of in a user's terminal.
//!
//! An example is a backquoted span starting with `rn50 ` in the long help of any subcommand, nested ones included.
//! It is parsed as the binary parses it, in this process (`rn50::cli::parse_only`, what `RN50_PARSE_ONLY=1 rn50 …`
//! runs); the worker command of a `rn50 launch … -- COMMAND` example is parsed the same way. A span that only names a command or one
//! of its flags (`rn50 launch`, `rn50 bench --json`) is a mention, not a command line: its command must exist and
//! the flag must be in that command's help.
//!
//! README's quick start is checked the same way: each of its command lines is an rn50 command that parses, the
//! SLURM script it names, whose arguments `rn50 train` parses, or the build step.
use std::path::Path;
use std::sync::OnceLock;

use crate::common::{rn50, rn50_parse_only};

/// `rn50 ARGS… --help`, which must succeed.
fn help(path: &[String]) -> String {
    let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
    args.push("--help");
    let out = rn50(&args);
    assert!(out.status.success(), "rn50 {}", args.join(" "));
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommand names listed under "Commands:" in a help text (clap's own `help` excluded).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("    "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Every command path (`[]`, `["prepare"]`, `["prepare", "verify"]`, …) with its long help: one `rn50 … --help`
/// process each, run once for all the tests of this file.
fn all_helps() -> &'static [(Vec<String>, String)] {
    static HELPS: OnceLock<Vec<(Vec<String>, String)>> = OnceLock::new();
    HELPS.get_or_init(|| {
        let mut todo = vec![Vec::new()];
        let mut done = Vec::new();
        while let Some(path) = todo.pop() {
            let text = help(&path);
            for sub in subcommands(&text) {
                let mut p = path.clone();
                p.push(sub);
                todo.push(p);
            }
            done.push((path, text));
        }
        done
    })
}

/// Backquoted spans starting with `rn50 `, with clap's line wrapping undone. In `launch`'s help a span starting
/// with `-- ` is the workers' command, checked as `rn50 launch --nproc-per-node 1 -- …`.
fn examples(help: &str, launch: bool) -> Vec<String> {
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    flat.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|s| match s.strip_prefix("-- ") {
            Some(worker) if launch => Some(format!("rn50 launch --nproc-per-node 1 -- {worker}")),
            _ => s.starts_with("rn50 ").then(|| s.to_string()),
        })
        .collect()
}

/// Checks one example; `Err` says what is wrong with it.
fn check(example: &str, commands: &[(Vec<String>, String)]) -> Result<(), String> {
    let words: Vec<&str> = example.split_whitespace().skip(1).collect();
    let path_len = (0..=words.len())
        .rev()
        .find(|&n| commands.iter().any(|(p, _)| p.iter().eq(&words[..n])))
        .unwrap();
    let (_, command_help) = commands
        .iter()
        .find(|(p, _)| p.iter().eq(&words[..path_len]))
        .unwrap();
    let rest = &words[path_len..];
    if path_len == 0 {
        return Err("names no subcommand".into());
    }
    // A mention: the command alone, or with one flag and no value.
    if rest.is_empty() || (rest.len() == 1 && rest[0].starts_with('-')) {
        return match rest.first() {
            Some(flag)
                if !command_help
                    .split(|c: char| c.is_whitespace() || c == ',')
                    .any(|w| w == *flag) =>
            {
                Err(format!("{flag} is not a flag of this command"))
            }
            _ => Ok(()),
        };
    }
    let out = rn50_parse_only(&words);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    // `rn50 launch … -- COMMAND`: the workers' command is an rn50 command line too.
    if words[0] == "launch" {
        let worker = words
            .iter()
            .position(|w| *w == "--")
            .map(|i| &words[i + 1..]);
        match worker {
            Some(w) if !w.is_empty() => check(&format!("rn50 {}", w.join(" ")), commands)?,
            _ => return Err("a launch example without `-- COMMAND`".into()),
        }
    }
    Ok(())
}

#[test]
fn every_help_example_parses() {
    let commands = all_helps();
    let names: Vec<String> = commands.iter().map(|(p, _)| p.join(" ")).collect();
    for want in ["train", "launch", "prepare verify", "report"] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    let mut checked = 0;
    let mut bad = Vec::new();
    for (path, text) in commands {
        for example in examples(text, path.iter().eq(["launch"])) {
            checked += 1;
            if let Err(why) = check(&example, commands) {
                bad.push(format!(
                    "`rn50 {} --help`: `{example}`: {why}",
                    path.join(" ")
                ));
            }
        }
    }
    assert!(
        checked >= 5,
        "only {checked} examples found: is the extraction broken?"
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The checker itself: the issue's wrong example fails, its fixed form and plain mentions pass.
#[test]
fn the_checker_catches_a_wrong_flag() {
    let commands = all_helps();
    assert!(check(
        "rn50 launch --nproc-per-node 2 -- train --data /imagenet",
        commands
    )
    .is_err());
    assert!(check("rn50 train --data", commands).is_err());
    assert!(check("rn50 trian /imagenet", commands).is_err());
    assert!(check(
        "rn50 launch --nproc-per-node 2 -- train /imagenet",
        commands
    )
    .is_ok());
    assert!(check("rn50 bench --json", commands).is_ok());
    assert!(check("rn50 launch", commands).is_ok());
    assert_eq!(
        examples(
            "see `rn50 launch\n    --nproc-per-node 2 -- train` and `--other`",
            false
        ),
        vec!["rn50 launch --nproc-per-node 2 -- train"]
    );
    // The example the issue found in `launch --help`.
    let old = examples("e.g. `-- train --data /imagenet`", true);
    assert_eq!(
        old,
        ["rn50 launch --nproc-per-node 1 -- train --data /imagenet"]
    );
    assert!(check(&old[0], commands).is_err());
}

/// The command lines of README's "Quick start" section: every ```sh block in it, comments dropped.
fn quick_start_lines(readme: &str) -> Vec<String> {
    let section = readme
        .split("\n## Quick start")
        .nth(1)
        .expect("README has a ## Quick start section");
    let section = section.split("\n## ").next().unwrap();
    section
        .split("```sh\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .flat_map(str::lines)
        .map(|l| l.split(" #").next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// README's quick start: every `rn50 …` line parses (a `launch` line's workers' command too); the `sbatch` line
/// names the SLURM script of this repository and its arguments parse as the script's `rn50 train --resume auto …`;
/// the only other line is the build. A renamed flag or a new kind of line fails here.
#[test]
fn every_quick_start_command_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let commands = all_helps();
    let lines = quick_start_lines(&readme);
    let mut bad = Vec::new();
    for line in &lines {
        let verdict = if line.starts_with("rn50 ") {
            check(line, commands)
        } else if let Some(rest) = line.strip_prefix("sbatch ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            match words.iter().position(|w| w.ends_with(".sbatch")) {
                Some(i) if root.join(words[i]).is_file() => {
                    let script = std::fs::read_to_string(root.join(words[i])).unwrap();
                    assert!(script.contains("train --resume auto \"$@\""));
                    check(
                        &format!("rn50 train --resume auto {}", words[i + 1..].join(" ")),
                        commands,
                    )
                }
                _ => Err("names no SLURM script of this repository".into()),
            }
        } else if line == "./dev build && export PATH=$PWD/target/release:$PATH" {
            Ok(())
        } else {
            Err("not an rn50, sbatch or build line".into())
        };
        if let Err(why) = verdict {
            bad.push(format!("`{line}`: {why}"));
        }
    }
    for want in [
        "rn50 prepare ",
        "rn50 train ",
        "rn50 eval ",
        "rn50 launch ",
        "sbatch ",
        "rn50 report ",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(want)),
            "the quick start has no `{want}…` line: {lines:?}"
        );
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// One option of a `--help` text: its long name, and the aliases shown with it (`[aliases: --a, --b]`).
#[derive(Debug)]
struct HelpOption {
    long: String,
    aliases: Vec<String>,
}

/// The options of a help text, each with the aliases its description shows. Options are the lines of the
/// "Options:" section (and any other heading's) that start, after the indentation, with `-x, --name` or `--name`;
/// the description is everything up to the next one, joined.
fn help_options(help: &str) -> Vec<HelpOption> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut in_args = false;
    for line in help.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            in_args = line == "Arguments:";
            continue;
        }
        let t = line.trim_start();
        let indent = line.len() - t.len();
        // Option lines are indented 2 (with a short) or 6 (without); descriptions 10.
        if !in_args && indent <= 6 && t.starts_with('-') {
            let long = t
                .split_whitespace()
                .find_map(|w| w.trim_end_matches(',').strip_prefix("--"))
                .map(|w| w.split('=').next().unwrap().to_string());
            if let Some(long) = long {
                out.push((long, String::new()));
                continue;
            }
        }
        if let Some((_, text)) = out.last_mut() {
            text.push(' ');
            text.push_str(t);
        }
    }
    out.into_iter()
        .map(|(long, text)| {
            // clap writes `[alias: --a]` for one, `[aliases: --a, --b]` for more.
            let aliases = text
                .split("[alias: ")
                .nth(1)
                .or_else(|| text.split("[aliases: ").nth(1))
                .and_then(|rest| rest.split(']').next())
                .map(|list| {
                    list.split(',')
                        .map(|a| a.trim().trim_start_matches("--").to_string())
                        .collect()
                })
                .unwrap_or_default();
            HelpOption { long, aliases }
        })
        .collect()
}

/// Whether `help` mentions the flag `--name` (not as the start of a longer name).
fn mentions(help: &str, name: &str) -> bool {
    let flag = format!("--{name}");
    help.match_indices(&flag).any(|(at, _)| {
        let before = help[..at].chars().next_back();
        let after = help[at + flag.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '-')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_')
    })
}

/// Every subcommand's clap definition, by name, nested ones reached through [`clap::Command::find_subcommand`]:
/// what the binary's `Command` enum holds (main.rs). [`one_name_per_thing`] checks that the list is complete.
fn definitions() -> Vec<clap::Command> {
    use clap::{Args, Command};
    vec![
        rn50_data::cli::PrepareArgs::augment_args(Command::new("prepare")),
        rn50_pipeline::cli::pack::PackArgs::augment_args(Command::new("pack")),
        rn50::bench::BenchArgs::augment_args(Command::new("bench")),
        rn50::train::TrainArgs::augment_args(Command::new("train")),
        rn50::train::EvalArgs::augment_args(Command::new("eval")),
        rn50::classify::ClassifyArgs::augment_args(Command::new("classify")),
        rn50::export::ExportArgs::augment_args(Command::new("export")),
        rn50_pipeline::cli::bench_loader::BenchLoaderArgs::augment_args(Command::new(
            "bench-loader",
        )),
        rn50_distributed::launch::LaunchArgs::augment_args(Command::new("launch")),
        rn50_report::report::ReportArgs::augment_args(Command::new("report")),
        rn50_report::scaling::ScalingArgs::augment_args(Command::new("scaling")),
        rn50::doctor::DoctorArgs::augment_args(Command::new("doctor")),
    ]
}

/// Names that say the same thing: the first is the name, the others its aliases, in every command that has any
/// of them (issue 44, item 6: `train` had `--steps-per-epoch` with `--max-steps-per-epoch` a hidden alias, and
/// `bench-loader` had `--size` where `train` and `bench` say `--image-size`).
const SYNONYMS: &[&[&str]] = &[
    &["max-steps-per-epoch", "steps-per-epoch"],
    &["image-size", "size"],
];

/// Issue 44, item 6, "one name per thing", over every subcommand's `--help` (the real binary's):
/// - no name is given to two options, or is one option's name and another's alias;
/// - the names of [`SYNONYMS`] are one option, under the first name, the others shown as its aliases;
/// - across commands, a name that is an alias in one is no option's name in another;
/// - every alias the help mentions (`timm's --min-lr`) is shown as an alias (`[aliases: --min-lr]`): a hidden
///   alias is a second name the reader cannot see is the same flag.
#[test]
fn one_name_per_thing() {
    let helps = all_helps();
    let defs = definitions();
    // The definitions are the binary's commands, all of them.
    let top: Vec<String> = subcommands(&helps.iter().find(|(p, _)| p.is_empty()).unwrap().1);
    let defined: Vec<String> = defs.iter().map(|c| c.get_name().to_string()).collect();
    assert_eq!(
        {
            let mut t = top.clone();
            t.sort();
            t
        },
        {
            let mut d = defined.clone();
            d.sort();
            d
        },
        "tests/program/help_examples.rs's definitions() are not main.rs's commands"
    );
    let mut bad = Vec::new();
    let mut primaries: Vec<(String, String)> = Vec::new();
    let mut shown_aliases: Vec<(String, String)> = Vec::new();
    for (path, help) in helps.iter().filter(|(p, _)| !p.is_empty()) {
        let name = path.join(" ");
        let def = path[1..]
            .iter()
            .try_fold(
                defs.iter().find(|c| c.get_name() == path[0]).unwrap(),
                |c, sub| c.find_subcommand(sub),
            )
            .unwrap_or_else(|| panic!("no definition of {name}"));
        let options = help_options(help);
        assert!(
            options.iter().any(|o| o.long == "help"),
            "no options found in `rn50 {name} --help`: is the parsing broken?\n{help}"
        );
        let mut seen: Vec<&str> = Vec::new();
        for o in &options {
            for n in std::iter::once(&o.long).chain(&o.aliases) {
                if seen.contains(&n.as_str()) {
                    bad.push(format!("rn50 {name}: --{n} names two options"));
                }
                seen.push(n);
            }
            primaries.push((o.long.clone(), name.clone()));
            shown_aliases.extend(o.aliases.iter().map(|a| (a.clone(), name.clone())));
        }
        for group in SYNONYMS {
            let named = options.iter().find(|o| o.long == group[0]);
            for alias in group[1..].iter().filter(|a| seen.contains(a)) {
                if !named.is_some_and(|o| o.aliases.iter().any(|a| a == alias)) {
                    bad.push(format!(
                        "rn50 {name}: --{alias} is not shown as an alias of --{}, the name of that thing",
                        group[0]
                    ));
                }
            }
        }
        // Aliases clap hides, mentioned in the help anyway.
        for arg in def.get_arguments() {
            let visible = arg.get_visible_aliases().unwrap_or_default();
            for alias in arg.get_all_aliases().unwrap_or_default() {
                if !visible.contains(&alias) && mentions(help, alias) {
                    bad.push(format!(
                        "rn50 {name}: the help mentions --{alias}, an alias of --{} it does not show as one",
                        arg.get_long().unwrap_or(arg.get_id().as_str())
                    ));
                }
            }
        }
    }
    for (alias, command) in &shown_aliases {
        for (long, other) in primaries.iter().filter(|(l, _)| l == alias) {
            bad.push(format!(
                "--{alias} is an alias in rn50 {command} but the name of an option of rn50 {other} (--{long})"
            ));
        }
    }
    // The issue's two pairs, as they are now.
    let option = |command: &str, long: &str| {
        let help = &helps
            .iter()
            .find(|(p, _)| p.join(" ") == command)
            .unwrap()
            .1;
        help_options(help).into_iter().find(|o| o.long == long)
    };
    for (command, long, alias) in [
        ("train", "max-steps-per-epoch", "steps-per-epoch"),
        ("bench-loader", "image-size", "size"),
    ] {
        let o = option(command, long).unwrap_or_else(|| panic!("rn50 {command} has no --{long}"));
        assert!(
            o.aliases.iter().any(|a| a == alias),
            "rn50 {command} --{long}: {o:?}"
        );
    }
    for command in ["train", "bench"] {
        assert!(option(command, "image-size").is_some(), "rn50 {command}");
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The checks of [`one_name_per_thing`] on made-up help texts: a pair under two names, an alias hidden but
/// mentioned.
#[test]
fn the_name_checker_reads_aliases_and_mentions() {
    let help = "Usage: rn50 x [OPTIONS]\n\nOptions:\n  -b, --batch-size <B>\n          Batch.\n\n      \
                --max-steps-per-epoch <N>\n          Stop early; not --max-steps.\n\n          [alias: \
                --steps-per-epoch]\n\n      --size <S>\n          Side.\n\n          [aliases: --a, --b]\n  -h, --help\n          Print help\n";
    let options = help_options(help);
    let names: Vec<(&str, Vec<&str>)> = options
        .iter()
        .map(|o| {
            (
                o.long.as_str(),
                o.aliases.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("batch-size", vec![]),
            ("max-steps-per-epoch", vec!["steps-per-epoch"]),
            ("size", vec!["a", "b"]),
            ("help", vec![]),
        ]
    );
    assert!(mentions(help, "max-steps") && mentions(help, "size"));
    assert!(!mentions(help, "steps") && !mentions(help, "batch"));
}
