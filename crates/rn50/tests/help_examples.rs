//! Every example command line in every `--help` parses (issue 14): a flag renamed or removed, or an example written
//! with a flag that never existed (`launch -- train --data …`), fails here instead of in a user's terminal.
//!
//! An example is a backquoted span starting with `rn50 ` in the long help of any subcommand, nested ones included.
//! It is run by the real binary with `RN50_PARSE_ONLY` set, which stops right after clap has parsed it; the worker
//! command of a `rn50 launch … -- COMMAND` example is parsed the same way. A span that only names a command or one
//! of its flags (`rn50 launch`, `rn50 bench --json`) is a mention, not a command line: its command must exist and
//! the flag must be in that command's help.
//!
//! README's quick start is checked the same way: each of its command lines is an rn50 command that parses, the
//! SLURM script it names, whose arguments `rn50 train` parses, or the build step.
use std::path::Path;
use std::process::Command;

fn rn50(args: &[&str], parse_only: bool) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rn50"));
    cmd.args(args);
    if parse_only {
        cmd.env("RN50_PARSE_ONLY", "1");
    }
    cmd.output().expect("run rn50")
}

/// `rn50 ARGS… --help`, which must succeed.
fn help(path: &[String]) -> String {
    let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
    args.push("--help");
    let out = rn50(&args, false);
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

/// Every command path (`[]`, `["prepare"]`, `["prepare", "verify"]`, …) with its long help.
fn all_helps() -> Vec<(Vec<String>, String)> {
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
    let out = rn50(&words, true);
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
    for (path, text) in &commands {
        for example in examples(text, path.iter().eq(["launch"])) {
            checked += 1;
            if let Err(why) = check(&example, &commands) {
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
        &commands
    )
    .is_err());
    assert!(check("rn50 train --data", &commands).is_err());
    assert!(check("rn50 trian /imagenet", &commands).is_err());
    assert!(check(
        "rn50 launch --nproc-per-node 2 -- train /imagenet",
        &commands
    )
    .is_ok());
    assert!(check("rn50 bench --json", &commands).is_ok());
    assert!(check("rn50 launch", &commands).is_ok());
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
    assert!(check(&old[0], &commands).is_err());
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
            check(line, &commands)
        } else if let Some(rest) = line.strip_prefix("sbatch ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            match words.iter().position(|w| w.ends_with(".sbatch")) {
                Some(i) if root.join(words[i]).is_file() => {
                    let script = std::fs::read_to_string(root.join(words[i])).unwrap();
                    assert!(script.contains("train --resume auto \"$@\""));
                    check(
                        &format!("rn50 train --resume auto {}", words[i + 1..].join(" ")),
                        &commands,
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
