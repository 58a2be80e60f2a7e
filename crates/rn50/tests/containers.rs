//! The container recipes (`Dockerfile`, `scripts/rn50.def`) stay in step with the README (issue 14): they run the
//! README's build commands, on the Rust image of the workspace's rust-version, with the pinned wheels of
//! scripts/requirements.txt and a CUDA base image of the wheel's CUDA version.
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
    assert_eq!(
        steps,
        [
            "./dev build",
            "cargo build --release --locked -p rn50 --features cuda"
        ]
    );
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
    assert!(at(&dockerfile, &steps[0]) < at(&dockerfile, &steps[1]));
    assert!(at(def_post, &steps[0]) < at(def_post, &steps[1]));
}

#[test]
fn the_recipes_use_the_workspaces_rust_and_the_pinned_wheels() {
    let dockerfile = read("Dockerfile");
    let def = read("scripts/rn50.def");
    let cargo = read("Cargo.toml");
    let requirements = read("scripts/requirements.txt");

    let rust_version = value_after(&cargo, "rust-version = ").trim_matches('"');
    let docker_rust = value_after(&dockerfile, "FROM rust:");
    assert_eq!(docker_rust, value_after(&def, "From: rust:"));
    assert_eq!(docker_rust, format!("{rust_version}-bookworm"));

    // The image that runs installs scripts/requirements.txt itself, and pins nothing of its own.
    assert!(dockerfile.contains("COPY scripts/requirements.txt /opt/rn50/scripts/requirements.txt"));
    assert!(dockerfile.contains("pip install --no-cache-dir --disable-pip-version-check -r /opt/rn50/scripts/requirements.txt"));
    assert!(!dockerfile.contains("=="), "a pin in the Dockerfile");
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
