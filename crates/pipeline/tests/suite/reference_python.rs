//! `rn50_util::testing::python_output`, which runs every reference script of the tests (here the most of them): a
//! process forked from one Python that imported torch once must behave as `python ARGS…` started afresh would.
use std::os::unix::process::ExitStatusExt;

use rn50_util::testing::python_output;

use crate::common::reference_env;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_script_gets_its_arguments_directory_and_folder_on_sys_path_and_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let (d, work) = (dir.path(), dir.path().join("work"));
    std::fs::create_dir(&work).unwrap();
    std::fs::write(d.join("sibling.py"), "VALUE = 'from the script folder'\n").unwrap();
    std::fs::write(
        d.join("script.py"),
        "import os, sys\nimport sibling\n\
         print(sys.argv[1:], os.getcwd(), sibling.VALUE, __name__)\n\
         print('to stderr', file=sys.stderr)\n\
         sys.exit(int(sys.argv[1]))\n",
    )
    .unwrap();
    let script = d.join("script.py");
    let out = python_output(
        &[script.as_os_str(), "3".as_ref(), "two words".as_ref()],
        Some(&work),
        &[],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!(
            "['3', 'two words'] {} from the script folder __main__\n",
            work.display()
        )
    );
    assert_eq!(text(&out.stderr), "to stderr\n");
    let ok = python_output(&[script.as_os_str(), "0".as_ref()], Some(&work), &[]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
}

#[test]
fn code_and_modules_run_as_main_and_a_failure_is_reported_as_python_does() {
    let out = python_output(
        &["-c", "import sys; print(__name__, sys.argv)", "a", "b"],
        None,
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "__main__ ['-c', 'a', 'b']\n");

    let out = python_output(&["-m", "json.tool", "--compact", "/dev/null"], None, &[]);
    // json.tool on an empty file: its own error, exit 1.
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("Expecting value"),
        "{}",
        text(&out.stderr)
    );

    let out = python_output(&["-c", "raise ValueError('broken reference')"], None, &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("Traceback") && err.contains("ValueError: broken reference"),
        "{err}"
    );

    let out = python_output(&["-c", "import os; os.kill(os.getpid(), 9)"], None, &[]);
    assert_eq!(out.status.signal(), Some(9), "{:?}", out.status);
}

/// Each process starts from the state after the import, never from what an earlier one changed; and what the
/// environment gives before the import (MKL_CBWR for the pipeline's references) is there.
#[test]
fn each_process_starts_afresh_with_its_environment() {
    let cbwr = std::env::var("MKL_CBWR").unwrap_or_else(|_| "AVX2".into());
    let probe = "import os, random, torch\n\
                 print(hasattr(torch, 'rn50_mark'), torch.rand(1).item(), random.random(), \
                 os.environ.get('MKL_CBWR'))\n\
                 torch.rn50_mark = 1\n\
                 torch.manual_seed(5)\n\
                 print(hasattr(torch, 'rn50_mark'))";
    let runs: Vec<String> = (0..2)
        .map(|_| {
            let out = python_output(&["-c", probe], None, reference_env());
            assert!(out.status.success(), "{}", text(&out.stderr));
            text(&out.stdout)
        })
        .collect();
    let fields: Vec<Vec<&str>> = runs
        .iter()
        .map(|r| r.split_whitespace().collect())
        .collect();
    for f in &fields {
        assert_eq!(
            (f[0], f[3], f[4]),
            ("False", cbwr.as_str(), "True"),
            "{runs:?}"
        );
    }
    // Every generator seeded from the OS, as in fresh processes (a fresh `import torch` seeds its own).
    for (k, what) in [(1, "torch.rand"), (2, "random.random")] {
        assert_ne!(fields[0][k], fields[1][k], "{what}: {runs:?}");
    }
}
