#!/usr/bin/env python3
"""ImageNet in the forms users download it in, written by the tools that write those forms, for the rn50 tests
(crates/pipeline/tests/suite/wds.rs and parquet.rs). SPEC.json lists the samples; each image is a file whose bytes
are stored as they are.

  wds PATTERN MAXCOUNT SPEC.json     webdataset.ShardWriter(PATTERN, maxcount=MAXCOUNT), one sample per item
                                     of SPEC: {"key", "image": FILE, "ext": "jpg", "cls": N, "json": {...}}
                                     ("cls" and "json" optional), as timm's imagenet-1k-wds was written
  parquet FILE ROWS SPEC.json        a datasets.Dataset of features {"image": Image(), "label":
                                     ClassLabel(names=SPEC["names"])} from SPEC["rows"] ([{"image": FILE,
                                     "label": N}]), written with to_parquet(FILE, batch_size=ROWS) (a row
                                     group each ROWS rows), as the Hub's ILSVRC/imagenet-1k files are;
                                     SPEC["image_column"] and SPEC["label_column"] rename the columns (null:
                                     leave the label out); with SPEC["compression"] the file is then written
                                     again by pyarrow.parquet.write_table with that codec (datasets stores
                                     image bytes uncompressed, pyarrow compresses with snappy by default)
"""
import json
import os
import sys


def read(path):
    with open(path, "rb") as f:
        return f.read()


def wds(pattern, maxcount, spec):
    import webdataset

    with webdataset.ShardWriter(pattern, maxcount=int(maxcount), verbose=0) as w:
        for s in spec:
            sample = {"__key__": s["key"], s.get("ext", "jpg"): read(s["image"])}
            if "cls" in s:
                sample["cls"] = s["cls"]
            if "json" in s:
                sample["json"] = s["json"]
            w.write(sample)


def parquet(path, rows, spec):
    from datasets import ClassLabel, Dataset, Features, Image

    image, label = spec.get("image_column", "image"), spec.get("label_column", "label")
    features = {image: Image()}
    data = {image: [{"bytes": read(r["image"]), "path": os.path.basename(r["image"])} for r in spec["rows"]]}
    if label is not None:
        features[label] = ClassLabel(names=spec["names"])
        data[label] = [r["label"] for r in spec["rows"]]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    Dataset.from_dict(data, features=Features(features)).to_parquet(path, batch_size=int(rows))
    if "compression" in spec:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        pq.write_table(table, path, compression=spec["compression"], row_group_size=int(rows))


def main():
    mode, *args = sys.argv[1:]
    *rest, spec = args
    with open(spec) as f:
        spec = json.load(f)
    {"wds": wds, "parquet": parquet}[mode](*rest, spec)


if __name__ == "__main__":
    main()
