//! Ctrl-C during `rn50 prepare` (issue 38): the first SIGINT stops the extraction between classes, the classes
//! in hand are finished and marked complete (a rerun keeps them), nothing half written is left, and prepare ends
//! with a "stopped on request" error that `rn50` turns into exit 3. Before, SIGINT killed the process.
//!
//! Alone in its test binary: the stop request is the process's, and stays set once this test sent it.
mod common;

use common::*;
use rn50_data::prepare;
use rn50_util::testing::sigint_when;

#[test]
fn ctrl_c_stops_between_classes_keeping_the_finished_ones() {
    let dir = tempfile::tempdir().unwrap();
    // 120 classes of one photo: extracting them one at a time takes far longer than the signal.
    let photos = photos();
    let outer: Vec<(String, Vec<u8>)> = photos
        .iter()
        .take(120)
        .map(|p| {
            let wnid = p.file_stem().unwrap().to_str().unwrap().to_string();
            let inner = tar_of(&[(format!("{wnid}_1.JPEG"), std::fs::read(p).unwrap())]);
            (format!("{wnid}.tar"), inner)
        })
        .collect();
    let tar = dir.path().join("ILSVRC2012_img_train.tar");
    std::fs::write(&tar, tar_of(&outer)).unwrap();
    let out = dir.path().join("out");
    let mut opts = options(Some(&tar), None, &out);
    opts.extract.threads = 1;

    // Ctrl-C once the first class is complete (its marker written).
    let markers = out.join(".rn50-prepare/train");
    let watcher = sigint_when(
        move || {
            std::fs::read_dir(&markers).is_ok_and(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().ends_with(".json"))
            })
        },
        "no class was completed",
    );
    let err = prepare(&opts).unwrap_err();
    watcher.join().unwrap();
    let stopped = err
        .chain()
        .find_map(|c| c.downcast_ref::<rn50_util::stop::Stopped>())
        .unwrap_or_else(|| panic!("not a stop: {err:#}"));
    assert_eq!(
        stopped.to_string(),
        "stopped on request (SIGINT): the classes extracted so far are kept; run the same command again to \
         continue"
    );

    // Every class folder there is complete and marked so; the rest of the archive was not extracted; no
    // temporary file is left; the archive is not marked done.
    let classes: Vec<String> = std::fs::read_dir(out.join("train"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !classes.is_empty() && classes.len() < 120,
        "{} classes",
        classes.len()
    );
    for wnid in &classes {
        assert!(
            out.join(format!(".rn50-prepare/train/{wnid}.json"))
                .is_file(),
            "{wnid} has no marker"
        );
        assert!(
            !out.join(format!(".rn50-prepare/train/{wnid}.started"))
                .exists()
                && std::fs::read_dir(out.join("train").join(wnid))
                    .unwrap()
                    .count()
                    == 1,
            "{wnid} is partial"
        );
    }
    assert!(!out.join(".rn50-prepare/train.done.json").exists());
    let temps: Vec<_> = all_paths(&out)
        .into_iter()
        // Within OUT: the temporary directory's own name (/tmp/.tmpXXXX) starts with .tmp too.
        .filter(|p| {
            p.strip_prefix(&out)
                .unwrap()
                .to_string_lossy()
                .contains(".tmp")
        })
        .collect();
    assert!(temps.is_empty(), "{temps:?}");
}
