"""Reference for tests/program/torch_save.rs: torchvision ResNets with seeded random weights saved with torch.save in the
forms PyTorch users have them, and their eval-mode logits on one input.

usage: torch_save_reference.py OUT_DIR   writes into OUT_DIR:
  resnet18.pth, resnet50.pth   a plain state_dict (torchvision's resnet50-11ad3fa6.pth layout); resnet50.pth
                               without the zip's CRC-32s (torch.utils.serialization.config.save.compute_crc32
                               off)
  checkpoint.pth.tar           pytorch/examples imagenet/main.py's save_checkpoint of a 4-class ResNet-18 wrapped as
                               main.py wraps it (DataParallel; DDP's state_dict is the same) after one SGD step:
                               {"epoch", "arch", "state_dict" (an OrderedDict, "module." prefixes), "best_acc1" (a
                               tensor), "optimizer", "scheduler"}
  cuda.pth.tar                 the same, its storages marked as saved from cuda:0 (what a GPU run writes)
  timm.pth.tar                 timm's CheckpointSaver layout: {"epoch", "arch", "state_dict" (resnet18's),
                               "state_dict_ema", "optimizer", "version", "args" (an argparse.Namespace), "metric"}
  legacy.pth                   resnet18's state_dict in torch.save's format before PyTorch 1.6
  scripted.pt                  resnet18 as TorchScript (torch.jit.save), not weights
  elsewhere.pth                tensors under a key no weights are looked for under: {"epoch", "net": {...}}
  short-record.pth,            {"fc.weight": 4x48 floats} whose storage record holds 4 bytes, and one float (4
  one-float-short.pth          bytes) less than the 768 its pickle claims; the zip's CRCs correct
  deep-lists.pth,              a valid archive whose data.pkl nests a million lists ("]" x 1,000,000, "a" x 999,999)
  deep-dicts.pth               or a million dicts ({"k": {"k": ...}}), 2 MB and 7 MB; CRCs correct
  resnet18.safetensors,        the weights of resnet18.pth and checkpoint.pth.tar as safetensors
  checkpoint.safetensors
  ref.safetensors              x (the input, NCHW) and the eval-mode logits_resnet18, logits_resnet50 and
                               logits_checkpoint
"""
import argparse
import io
import sys
import zipfile
from pathlib import Path

import torch
import torch.utils.serialization
import torchvision
from safetensors.torch import save_file

out = Path(sys.argv[1])


def model(arch, num_classes=1000):
    m = getattr(torchvision.models, arch)(num_classes=num_classes)
    # Batch-norm statistics away from their 0/1 initialisation, so that a file whose buffers were not loaded fails.
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
    return m.eval()


torch.manual_seed(0)
x = torch.randn(2, 3, 64, 64)
ref = {"x": x}
r18 = model("resnet18")
r50 = model("resnet50")
for name, m in [("resnet18", r18), ("resnet50", r50)]:
    torch.utils.serialization.config.save.compute_crc32 = name == "resnet18"
    torch.save(m.state_dict(), out / f"{name}.pth")
    torch.utils.serialization.config.save.compute_crc32 = True
    with torch.no_grad():
        ref[f"logits_{name}"] = m(x)
assert all(i.CRC == 0 for i in zipfile.ZipFile(out / "resnet50.pth").infolist())
assert all(i.CRC != 0 for i in zipfile.ZipFile(out / "resnet18.pth").infolist() if i.file_size)

# main.py after one step: the model trained one SGD step in train mode, its checkpoint the state at that point. The
# reference logits are those of the weights saved.
trained = model("resnet18", num_classes=4).train()
wrapped = torch.nn.DataParallel(trained)
opt = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)
loss = torch.nn.functional.cross_entropy(wrapped(torch.randn(4, 3, 64, 64)), torch.tensor([0, 1, 2, 3]))
loss.backward()
opt.step()
sched.step()
trained.eval()
with torch.no_grad():
    ref["logits_checkpoint"] = trained(x)
state = {
    "epoch": 3,
    "arch": "resnet18",
    "state_dict": wrapped.state_dict(),
    "best_acc1": torch.tensor(12.5),
    "optimizer": opt.state_dict(),
    "scheduler": sched.state_dict(),
}
assert next(iter(state["state_dict"])).startswith("module.") and hasattr(state["state_dict"], "_metadata")
torch.save(state, out / "checkpoint.pth.tar")
save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, out / "checkpoint.safetensors")
save_file({k: v.contiguous() for k, v in r18.state_dict().items()}, out / "resnet18.safetensors")
back = torch.load(out / "checkpoint.pth.tar", map_location="cpu")
assert back["state_dict"]["module.fc.bias"].equal(trained.fc.bias.detach())

# The same file as a GPU run writes it: each storage's location is "cuda:0" instead of "cpu" (torch.save pickles
# it as a string; protocol 2 writes strings as BINUNICODE, a 4-byte length then the bytes).
buf = io.BytesIO()
with zipfile.ZipFile(out / "checkpoint.pth.tar") as src, zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as dst:
    for info in src.infolist():
        data = src.read(info)
        if info.filename.endswith("/data.pkl"):
            cpu, cuda = b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0"
            assert data.count(cpu) > 0
            data = data.replace(cpu, cuda)
        dst.writestr(info, data)
(out / "cuda.pth.tar").write_bytes(buf.getvalue())
assert b"cuda:0" in zipfile.ZipFile(out / "cuda.pth.tar").read("checkpoint.pth/data.pkl")
back = torch.load(out / "cuda.pth.tar", map_location="cpu")
assert back["state_dict"]["module.fc.bias"].equal(trained.fc.bias.detach())

# timm: no "module." (it unwraps DDP), an EMA copy, and the run's arguments as an argparse.Namespace.
ema = model("resnet18")
torch.save(
    {
        "epoch": 7,
        "arch": "resnet18",
        "state_dict": r18.state_dict(),
        "state_dict_ema": ema.state_dict(),
        "optimizer": torch.optim.SGD(r18.parameters(), lr=0.1).state_dict(),
        "version": 2,
        "args": argparse.Namespace(model="resnet18", lr=0.1, epochs=10, amp=True),
        "metric": 12.5,
    },
    out / "timm.pth.tar",
)

torch.save(r18.state_dict(), out / "legacy.pth", _use_new_zipfile_serialization=False)
torch.jit.save(torch.jit.trace(r18, x), out / "scripted.pt")
torch.save({"epoch": 3, "net": {"fc.bias": torch.zeros(4)}}, out / "elsewhere.pth")
save_file({k: v.contiguous() for k, v in ref.items()}, out / "ref.safetensors")


def rewritten(src, dst, edit):
    """`src` (a torch.save zip) written to `dst` with each record's bytes edit(name, bytes), CRCs recomputed."""
    buf = io.BytesIO()
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as w:
        for info in z.infolist():
            w.writestr(info, edit(info.filename, z.read(info)))
    dst.write_bytes(buf.getvalue())


torch.save({"fc.weight": torch.randn(4, 48)}, out / "one-tensor.pth")
for name, keep in [("short-record.pth", 4), ("one-float-short.pth", 764)]:
    rewritten(out / "one-tensor.pth", out / name, lambda record, b: b[:keep] if record.endswith("/data/0") else b)
    assert len(zipfile.ZipFile(out / name).read("one-tensor/data/0")) == keep
    zipfile.ZipFile(out / name).testzip()
n = 1_000_000
deep = {
    "deep-lists.pth": b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b".",
    "deep-dicts.pth": b"\x80\x02" + b"}X\x01\x00\x00\x00k" * n + b"}" + b"s" * n + b".",
}
for name, pickle in deep.items():
    rewritten(out / "one-tensor.pth", out / name, lambda record, b: pickle if record.endswith("/data.pkl") else b)
