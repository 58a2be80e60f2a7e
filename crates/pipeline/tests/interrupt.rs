//! Ctrl-C during `rn50 pack` (issue 38): the first SIGINT stops the pack after the images in hand and removes
//! what it wrote (its finished shards, which without a manifest are no dataset and would make the same command
//! refuse OUT, and the shard in progress), so OUT is left empty; pack ends with a "stopped on request" error that
//! `rn50` turns into exit 3. Before, SIGINT killed the process and left the shards.
//!
//! Alone in its test binary: the stop request is the process's, and stays set once this test sent it.
mod common;

use common::*;
use rn50_pipeline::pack::{pack, PackOptions};
use rn50_pipeline::{BadImagePolicy, Dataset};
use rn50_util::testing::sigint_when;

#[test]
fn ctrl_c_stops_the_pack_and_removes_its_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = Dataset::open(imagenet_folder(tmp.path())).unwrap();
    let out = tmp.path().join("out");
    // One worker and a shard per image: the 220 images are packed in 4 rounds of 64, one shard after another.
    let opts = PackOptions {
        max_side: None,
        quality: 90,
        shard_bytes: 1,
        workers: 1,
        on_bad_image: BadImagePolicy::Skip,
        max_image_pixels: rn50_pipeline::decode::MAX_IMAGE_PIXELS,
        progress: false,
    };
    // Ctrl-C once the first shard is finished.
    let first = out.join("shard-00000.rn50shard");
    let watcher = sigint_when(move || first.exists(), "no shard was finished");
    let err = pack(&folder, &out, &opts).unwrap_err();
    watcher.join().unwrap();
    let stopped = err
        .chain()
        .find_map(|c| c.downcast_ref::<rn50_util::stop::Stopped>())
        .unwrap_or_else(|| panic!("not a stop: {err:#}"));
    let msg = stopped.to_string();
    assert!(
        msg.starts_with("stopped on request (SIGINT): removed the ")
            && msg.ends_with(&format!(
                " shard(s) this pack had written to {}; run the same command again to pack",
                out.display()
            )),
        "{msg}"
    );
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    // Nothing of the stopped pack is in the way of the same command again.
    assert!(left.is_empty(), "{left:?}");
}
