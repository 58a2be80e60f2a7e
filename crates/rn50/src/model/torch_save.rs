//! torch.save files (the zip format of PyTorch 1.6 and later), read without Python through libtorch's unpickler
//! (`crates/shim/cpp/shim.cpp`). That unpickler was written for TorchScript archives and takes two things of a plain
//! `torch.save(model.state_dict())` wrongly: it turns `collections.OrderedDict()` into None (it expects one only as
//! a tensor's unused backward hooks), so the items of a state_dict, an OrderedDict, fail to load; and it runs
//! BUILD as a call, which fails on the `_metadata` attribute a state_dict carries. [`plain_dicts`] rewrites the
//! pickle around both before it is unpickled, with the opcodes that unpickler knows (protocol 2's, less a few:
//! it has no POP, but its NEWOBJ drops the top of the stack, leaving the call to the REDUCE or BUILD that
//! follows).
//!
//! Before that, every record of the zip archive is checked against the CRC-32 the archive records for it
//! ([`check_crcs`]): neither libtorch nor torch.load does, so a file damaged inside a tensor's bytes loads, as other
//! numbers.
//! The pickle's nesting is bounded before libtorch sees it ([`check_nesting`]): libtorch builds and destroys
//! nested values recursively, and a crafted pickle a million lists deep overflowed the stack (an abort).
//! The central directory is read here ([`records`]) rather than with the `zip` crate: zip 9.8 refused a
//! torch.save archive that torch.load reads ("Invalid Central Directory header", tests/program/torch_save.rs's legacy
//! conversion), and a check that refuses good files is worse than none.
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::{bail, Context, Result};
use tch::Tensor;

use crate::shim;

/// Every tensor of the torch.save file `path`, on the CPU, named by where it sits in the pickled structure (dict
/// keys and list indices joined by `/`), in the file's order.
pub fn tensors(path: &Path) -> Result<Vec<(String, Tensor)>> {
    check_crcs(path)?;
    let pickle = shim::torch_pickle(path)?;
    check_nesting(&pickle)?;
    shim::torch_unpickle(path, &plain_dicts(&pickle)?)
}

/// The little-endian integer of `N` bytes at `at` in `b`; None past its end.
fn le<const N: usize>(b: &[u8], at: usize) -> Option<u64> {
    let bytes: [u8; N] = b.get(at..at.checked_add(N)?)?.try_into().ok()?;
    Some(bytes.iter().rev().fold(0, |n, &x| (n << 8) | u64::from(x)))
}

/// `n` bytes of `f` from `offset`.
fn read_at(f: &mut File, offset: u64, n: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    f.seek(SeekFrom::Start(offset))?;
    f.take(n).read_to_end(&mut buf)?;
    Ok(buf)
}

/// One record of a zip archive's central directory: what [`check_crcs`] needs of it.
struct Record {
    name: String,
    crc32: u32,
    stored: bool,
    size: u64,
    local_header: u64,
}

/// The records of the zip archive `f` (`len` bytes) from its central directory, ZIP64 included (PyTorch writes
/// it past 4 GiB); None where the archive is cut short or damaged.
fn records(f: &mut File, len: u64) -> Option<Vec<Record>> {
    // The end-of-central-directory record: 22 bytes and a comment of at most 64 KiB, at the very end.
    let tail_start = len.saturating_sub(22 + 0xffff);
    let tail = read_at(f, tail_start, len - tail_start).ok()?;
    let eocd = tail.windows(4).rposition(|w| w == b"PK\x05\x06")?;
    let (mut count, mut size, mut offset) = (
        le::<2>(&tail, eocd + 10)?,
        le::<4>(&tail, eocd + 12)?,
        le::<4>(&tail, eocd + 16)?,
    );
    if count == 0xffff || size == 0xffff_ffff || offset == 0xffff_ffff {
        // ZIP64: a locator right before, giving the offset of the ZIP64 end record.
        let locator = eocd.checked_sub(20)?;
        (tail.get(locator..locator + 4)? == b"PK\x06\x07").then_some(())?;
        let end = read_at(f, le::<8>(&tail, locator + 8)?, 56).ok()?;
        (end.get(..4)? == b"PK\x06\x06").then_some(())?;
        (count, size, offset) = (le::<8>(&end, 32)?, le::<8>(&end, 40)?, le::<8>(&end, 48)?);
    }
    let dir = read_at(f, offset, size).ok()?;
    let mut out = Vec::new();
    let mut at = 0;
    for _ in 0..count {
        (dir.get(at..at + 4)? == b"PK\x01\x02").then_some(())?;
        let name_len = le::<2>(&dir, at + 28)? as usize;
        let extra_len = le::<2>(&dir, at + 30)? as usize;
        let comment_len = le::<2>(&dir, at + 32)? as usize;
        let name = dir.get(at + 46..at + 46 + name_len)?;
        let extra = dir.get(at + 46 + name_len..at + 46 + name_len + extra_len)?;
        let (mut size, mut local_header) = (le::<4>(&dir, at + 20)?, le::<4>(&dir, at + 42)?);
        // ZIP64 extra field (id 1): the 8-byte sizes and offset whose 4-byte fields read 0xffffffff, in order.
        let mut e = 0;
        while e + 4 <= extra.len() {
            let (id, n) = (le::<2>(extra, e)?, le::<2>(extra, e + 2)? as usize);
            if id == 1 {
                let mut field = e + 4;
                let mut next = || -> Option<u64> {
                    field += 8;
                    le::<8>(extra, field - 8)
                };
                if le::<4>(&dir, at + 24)? == 0xffff_ffff {
                    next()?;
                }
                if size == 0xffff_ffff {
                    size = next()?;
                }
                if local_header == 0xffff_ffff {
                    local_header = next()?;
                }
            }
            e += 4 + n;
        }
        out.push(Record {
            name: String::from_utf8_lossy(name).into_owned(),
            crc32: le::<4>(&dir, at + 16)? as u32,
            stored: le::<2>(&dir, at + 10)? == 0,
            size,
            local_header,
        });
        at += 46 + name_len + extra_len + comment_len;
    }
    Some(out)
}

/// Checks each stored record of the zip archive `path` against the CRC-32 of its central directory. A CRC of 0 is
/// none recorded (torch.save with `compute_crc32` off) and is not checked; compressed records are libtorch's to read.
fn check_crcs(path: &Path) -> Result<()> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = f.metadata()?.len();
    let records = records(&mut f, len).context(
        "not a whole zip archive (its central directory is missing or damaged: cut short?)",
    )?;
    for r in records.iter().filter(|r| r.stored && r.crc32 != 0) {
        let header = read_at(&mut f, r.local_header, 30)?;
        let start = match (&header.get(..4), le::<2>(&header, 26), le::<2>(&header, 28)) {
            (Some(b"PK\x03\x04"), Some(n), Some(m)) => r.local_header + 30 + n + m,
            _ => bail!("damaged zip archive: no header for {}", r.name),
        };
        f.seek(SeekFrom::Start(start))?;
        let mut hasher = crc32fast::Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut left = r.size;
        while left > 0 {
            let n = f.read(&mut buf[..left.min(1 << 20) as usize])?;
            if n == 0 {
                bail!("{} is cut short", r.name);
            }
            hasher.update(&buf[..n]);
            left -= n as u64;
        }
        let crc = hasher.finalize();
        if crc != r.crc32 {
            bail!(
                "{} is damaged: its CRC-32 is {crc:08x}, the archive recorded {:08x}",
                r.name,
                r.crc32
            );
        }
    }
    Ok(())
}

/// The pickle opcodes this module acts on (Python's `pickletools` names).
mod op {
    pub const PROTO: u8 = 0x80;
    pub const GLOBAL: u8 = b'c';
    pub const NONE: u8 = b'N';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const EMPTY_DICT: u8 = b'}';
    pub const REDUCE: u8 = b'R';
    pub const BUILD: u8 = b'b';
    /// Pops the top of the stack in libtorch's unpickler (see the module's doc).
    pub const NEWOBJ: u8 = 0x81;
    pub const STOP: u8 = b'.';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
}

/// The length of the argument of opcode `op`, which starts `rest` (the table of Python's `pickletools`); None for
/// a byte that is no opcode of protocols 0 to 5, or an argument cut short.
fn arg_len(op: u8, rest: &[u8]) -> Option<usize> {
    let fixed = |n: usize| (rest.len() >= n).then_some(n);
    // A little-endian length of `width` bytes, then that many bytes.
    let counted = |width: usize| -> Option<usize> {
        let len = rest.get(..width)?;
        let n = len.iter().rev().fold(0u64, |n, &b| (n << 8) | u64::from(b));
        let total = width.checked_add(usize::try_from(n).ok()?)?;
        (rest.len() >= total).then_some(total)
    };
    // `lines` newline-terminated fields.
    let lines = |lines: usize| -> Option<usize> {
        let mut end = 0;
        for _ in 0..lines {
            end += rest[end..].iter().position(|&b| b == b'\n')? + 1;
        }
        Some(end)
    };
    match op {
        b'(' | b'.' | b'0' | b'1' | b'2' | b'N' | b'}' | b']' | b')' | b'a' | b'e' | b'b'
        | b'd' | b'l' | b't' | b's' | b'u' | b'R' | b'o' | b'Q' => Some(0),
        0x85..=0x89 | 0x81 | 0x8f..=0x94 | 0x97 | 0x98 => Some(0),
        b'K' | b'q' | b'h' | 0x80 | 0x82 => fixed(1),
        b'M' | 0x83 => fixed(2),
        b'J' | b'r' | b'j' | 0x84 => fixed(4),
        b'G' | 0x95 => fixed(8),
        b'I' | b'L' | b'S' | b'V' | b'F' | b'p' | b'g' | b'P' => lines(1),
        b'c' | b'i' => lines(2),
        b'U' | b'C' | 0x8a | 0x8c => counted(1),
        b'T' | b'X' | b'B' | 0x8b => counted(4),
        0x8d | 0x8e | 0x96 => counted(8),
        _ => None,
    }
}

/// How deep values may nest in a torch.save pickle. Python's pickler recurses once per level and stops at its
/// recursion limit (1,000 by default), so torch.save writes nothing deeper; libtorch's unpickler builds deeper
/// values but destroys them recursively, and a million levels overflowed the stack.
pub const MAX_NESTING: u32 = 1000;

/// Refuses a pickle whose values nest deeper than [`MAX_NESTING`], followed opcode by opcode as Python's
/// unpickler would build them (each value's depth: 0 for a number, string or class, 1 + its deepest part for a
/// container, object or storage). A value may not change once it is inside another: a pickle of data (what
/// torch.save writes) completes each value before placing it, and only a recursive structure changes one after,
/// which this check could not follow (and which is no weights file).
fn check_nesting(pickle: &[u8]) -> Result<()> {
    /// A value on the stack or in the memo: its depth, and whether it was placed inside another.
    #[derive(Clone, Copy)]
    struct Node {
        depth: u32,
        placed: bool,
    }
    let mut nodes: Vec<Node> = Vec::new();
    // The stack of value indices into `nodes`; None is a MARK.
    let mut stack: Vec<Option<usize>> = Vec::new();
    let mut memo: HashMap<u64, usize> = HashMap::new();
    let damaged =
        |i: usize, code: u8| anyhow::anyhow!("damaged pickle: opcode {code:#04x} at byte {i}");
    let mut i = 0;
    while i < pickle.len() {
        let (at, code) = (i, pickle[i]);
        let n = arg_len(code, &pickle[i + 1..]).ok_or_else(|| damaged(at, code))?;
        let arg = &pickle[i + 1..i + 1 + n];
        i += 1 + n;
        let pop =
            |stack: &mut Vec<Option<usize>>| stack.pop().flatten().ok_or_else(|| damaged(at, code));
        let to_mark = |stack: &mut Vec<Option<usize>>| -> Result<Vec<usize>> {
            let mark = stack
                .iter()
                .rposition(Option::is_none)
                .ok_or_else(|| damaged(at, code))?;
            Ok(stack.drain(mark..).flatten().collect())
        };
        // `parts` placed inside the value `into` (a new one when None, pushed): its depth grows past theirs.
        let place = |nodes: &mut Vec<Node>,
                     stack: &mut Vec<Option<usize>>,
                     into: Option<usize>,
                     parts: &[usize]|
         -> Result<()> {
            let depth = parts.iter().map(|&p| nodes[p].depth + 1).max().unwrap_or(1);
            for &p in parts {
                nodes[p].placed = true;
            }
            let target = match into {
                Some(t) => {
                    if nodes[t].placed {
                        bail!(
                            "damaged pickle: a value changes after it was placed in another (a recursive \
                             structure, at byte {at}), which no weights file holds"
                        );
                    }
                    nodes[t].depth = nodes[t].depth.max(depth);
                    t
                }
                None => {
                    nodes.push(Node {
                        depth,
                        placed: false,
                    });
                    stack.push(Some(nodes.len() - 1));
                    nodes.len() - 1
                }
            };
            if nodes[target].depth > MAX_NESTING {
                bail!(
                    "its pickle nests values more than {MAX_NESTING} deep (at byte {at}), deeper than \
                     torch.save writes: a crafted file?"
                );
            }
            Ok(())
        };
        let top = |stack: &Vec<Option<usize>>| {
            stack
                .last()
                .copied()
                .flatten()
                .ok_or_else(|| damaged(at, code))
        };
        match code {
            op::STOP => return Ok(()),
            op::PROTO | 0x95 | 0x98 => {}
            b'(' => stack.push(None),
            b'0' => {
                stack.pop().ok_or_else(|| damaged(at, code))?;
            }
            b'1' => {
                to_mark(&mut stack)?;
            }
            b'2' => stack.push(Some(top(&stack)?)),
            op::PUT | op::BINPUT | op::LONG_BINPUT | 0x94 => {
                let slot = match code {
                    0x94 => memo.len() as u64,
                    _ => memo_slot(code, arg).ok_or_else(|| damaged(at, code))?,
                };
                memo.insert(slot, top(&stack)?);
            }
            op::GET | op::BINGET | op::LONG_BINGET => {
                let slot = memo_slot(code, arg).ok_or_else(|| damaged(at, code))?;
                stack.push(Some(*memo.get(&slot).ok_or_else(|| damaged(at, code))?));
            }
            // Empty containers.
            b']' | b'}' | b')' | 0x8f => place(&mut nodes, &mut stack, None, &[])?,
            // A new value of the values above the mark: LIST, TUPLE, DICT, FROZENSET, OBJ, INST.
            b'l' | b't' | b'd' | 0x91 | b'o' | b'i' => {
                let parts = to_mark(&mut stack)?;
                place(&mut nodes, &mut stack, None, &parts)?;
            }
            // A new value of the top 1, 2 or 3: TUPLE1-3, BINPERSID, REDUCE, NEWOBJ, NEWOBJ_EX, STACK_GLOBAL.
            0x85 | b'Q' | 0x86 | b'R' | op::NEWOBJ | 0x93 | 0x87 | 0x92 => {
                let k = match code {
                    0x85 | b'Q' => 1,
                    0x86 | b'R' | op::NEWOBJ | 0x93 => 2,
                    _ => 3,
                };
                let parts = (0..k)
                    .map(|_| pop(&mut stack))
                    .collect::<Result<Vec<_>>>()?;
                place(&mut nodes, &mut stack, None, &parts)?;
            }
            // The top 1 or 2 placed in the value below them: APPEND, BUILD; SETITEM.
            b'a' | op::BUILD | b's' => {
                let k = if code == b's' { 2 } else { 1 };
                let parts = (0..k)
                    .map(|_| pop(&mut stack))
                    .collect::<Result<Vec<_>>>()?;
                let into = top(&stack)?;
                place(&mut nodes, &mut stack, Some(into), &parts)?;
            }
            // The values above the mark placed in the value below it: APPENDS, SETITEMS, ADDITEMS.
            b'e' | b'u' | 0x90 => {
                let parts = to_mark(&mut stack)?;
                let into = top(&stack)?;
                place(&mut nodes, &mut stack, Some(into), &parts)?;
            }
            // Every other opcode pushes one number, string, class or buffer.
            _ => {
                nodes.push(Node {
                    depth: 0,
                    placed: false,
                });
                stack.push(Some(nodes.len() - 1));
            }
        }
    }
    bail!("damaged pickle: it ends before its STOP opcode")
}

/// The memo slot a PUT or GET opcode names.
fn memo_slot(op: u8, arg: &[u8]) -> Option<u64> {
    match op {
        op::BINPUT | op::BINGET => Some(u64::from(arg[0])),
        op::LONG_BINPUT | op::LONG_BINGET => {
            Some(u64::from(u32::from_le_bytes(arg.try_into().ok()?)))
        }
        _ => std::str::from_utf8(arg).ok()?.trim_end().parse().ok(),
    }
}

/// `pickle` rewritten for libtorch's unpickler (see the module's doc), opcode by opcode:
/// - GLOBAL `collections OrderedDict` becomes NONE, a placeholder, memoized where the class was;
/// - EMPTY_TUPLE REDUCE on that placeholder (pushed by the GLOBAL or a GET of its memo slot), the call
///   `OrderedDict()`, becomes NEWOBJ EMPTY_DICT: the placeholder dropped, a plain dict, which the items that
///   follow fill;
/// - BUILD becomes NEWOBJ, dropping the state it would set: objects' attributes hold no weights (a state_dict's is
///   its `_metadata`, the modules' versions).
///
/// Protocol 2, torch.save's default and the one libtorch reads.
fn plain_dicts(pickle: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(pickle.len());
    let mut slots: HashSet<u64> = HashSet::new();
    // Whether the top of the stack is the OrderedDict placeholder.
    let mut on_top = false;
    let mut i = 0;
    while i < pickle.len() {
        let code = pickle[i];
        let rest = &pickle[i + 1..];
        let n = arg_len(code, rest)
            .with_context(|| format!("damaged pickle: opcode {code:#04x} at byte {i}"))?;
        let (arg, whole) = (&rest[..n], &pickle[i..i + 1 + n]);
        i += 1 + n;
        match code {
            op::PROTO if arg[0] != 2 => bail!(
                "pickle protocol {} (torch.save's pickle_protocol): rn50 reads 2, the default",
                arg[0]
            ),
            op::GLOBAL if arg == b"collections\nOrderedDict\n" => {
                out.push(op::NONE);
                on_top = true;
            }
            op::PUT | op::BINPUT | op::LONG_BINPUT => {
                if on_top {
                    slots.extend(memo_slot(code, arg));
                }
                out.extend_from_slice(whole);
            }
            op::GET | op::BINGET | op::LONG_BINGET => {
                on_top = memo_slot(code, arg).is_some_and(|s| slots.contains(&s));
                out.extend_from_slice(whole);
            }
            op::EMPTY_TUPLE if on_top && pickle.get(i) == Some(&op::REDUCE) => {
                out.extend_from_slice(&[op::NEWOBJ, op::EMPTY_DICT]);
                on_top = false;
                i += 1;
            }
            op::BUILD => {
                out.push(op::NEWOBJ);
                on_top = false;
            }
            op::STOP => {
                out.push(code);
                return Ok(out);
            }
            _ => {
                out.extend_from_slice(whole);
                on_top = false;
            }
        }
    }
    bail!("damaged pickle: it ends before its STOP opcode")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Python 3.11's pickle (protocol 2) writes for `OrderedDict([("a", 1), ("b", 2)])` with an attribute
    /// `_metadata = {}`, the shape of a state_dict, followed by a second, empty OrderedDict (its class from the
    /// memo): `[od, OrderedDict()]`.
    const STATE_DICT: &[u8] = b"\x80\x02]q\x00(ccollections\nOrderedDict\nq\x01)Rq\x02(X\x01\x00\x00\x00aq\x03K\x01X\x01\x00\x00\x00bq\x04K\x02u}q\x05X\t\x00\x00\x00_metadataq\x06}q\x07sbh\x01)Rq\x08e.";

    #[test]
    fn ordered_dicts_become_plain_dicts_and_build_drops_its_state() {
        let got = plain_dicts(STATE_DICT).unwrap();
        let want: &[u8] = b"\x80\x02]q\x00(Nq\x01\x81}q\x02(X\x01\x00\x00\x00aq\x03K\x01X\x01\x00\x00\x00bq\x04K\x02u}q\x05X\t\x00\x00\x00_metadataq\x06}q\x07s\x81h\x01\x81}q\x08e.";
        assert_eq!(got, want);
    }

    #[test]
    fn damaged_and_newer_pickles_are_errors() {
        for (bytes, want) in [
            (&STATE_DICT[..38], "ends before its STOP"),
            (
                &b"\x80\x02X\xff\xff\x00\x00ab."[..],
                "damaged pickle: opcode 0x58 at byte 2",
            ),
            (&b"\x80\x02\xff."[..], "damaged pickle: opcode 0xff"),
            (
                &b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00N."[..],
                "pickle protocol 4",
            ),
            (&b"\x80\x03N."[..], "pickle protocol 3"),
        ] {
            let err = plain_dicts(bytes).unwrap_err();
            assert!(format!("{err:#}").contains(want), "{err:#}");
        }
    }

    /// Nesting is bounded however a pickle builds it: directly (lists in lists), through the memo (each new list
    /// holding the one memoized before it), and a value that changes once placed (a list appended to itself) is
    /// refused; a state_dict's pickle passes.
    #[test]
    fn nesting_is_bounded_however_it_is_built() {
        let err = |r: Result<()>| format!("{:#}", r.unwrap_err());
        check_nesting(STATE_DICT).unwrap();
        let lists =
            |n: usize| [&b"\x80\x02"[..], &vec![b']'; n], &vec![b'a'; n - 1], b"."].concat();
        check_nesting(&lists(MAX_NESTING as usize)).unwrap();
        assert!(err(check_nesting(&lists(1001))).contains("nests values more than 1000 deep"));
        let memo = |n: usize| [&b"\x80\x02]q\x00"[..], &b"]h\x00aq\x000".repeat(n), b"."].concat();
        check_nesting(&memo(MAX_NESTING as usize - 1)).unwrap();
        assert!(err(check_nesting(&memo(1000))).contains("more than 1000 deep"));
        let cycle = b"\x80\x02]q\x00h\x00a.";
        assert!(err(check_nesting(cycle)).contains("changes after it was placed"));
        assert!(err(check_nesting(b"\x80\x02a.")).contains("damaged pickle: opcode 0x61 at byte 2"));
    }

    /// A ZIP64 archive (what PyTorch writes past 4 GiB) of one stored record, made by hand: every size and offset
    /// in the 8-byte fields, the 4-byte ones 0xffffffff. Python's zipfile reads it.
    fn zip64(data: &[u8]) -> Vec<u8> {
        let (name, crc) = (b"w/data/0", crc32fast::hash(data));
        let (n, len) = (name.len() as u16, data.len() as u64);
        let mut z = Vec::new();
        z.extend(b"PK\x03\x04\x2d\0\0\0\0\0\0\0\0\0");
        z.extend(crc.to_le_bytes());
        z.extend([0xff; 8]);
        z.extend(n.to_le_bytes());
        z.extend(20u16.to_le_bytes());
        z.extend(name);
        z.extend(1u16.to_le_bytes());
        z.extend(16u16.to_le_bytes());
        z.extend(len.to_le_bytes());
        z.extend(len.to_le_bytes());
        z.extend(data);
        let dir = z.len() as u64;
        z.extend(b"PK\x01\x02\x2d\0\x2d\0\0\0\0\0\0\0\0\0");
        z.extend(crc.to_le_bytes());
        z.extend([0xff; 8]);
        z.extend(n.to_le_bytes());
        z.extend(28u16.to_le_bytes());
        z.extend([0; 10]);
        z.extend([0xff; 4]);
        z.extend(name);
        z.extend(1u16.to_le_bytes());
        z.extend(24u16.to_le_bytes());
        z.extend(len.to_le_bytes());
        z.extend(len.to_le_bytes());
        z.extend(0u64.to_le_bytes());
        let (dir_len, end) = (z.len() as u64 - dir, z.len() as u64);
        z.extend(b"PK\x06\x06");
        z.extend(44u64.to_le_bytes());
        z.extend(b"\x2d\0\x2d\0");
        z.extend([0; 8]);
        z.extend(1u64.to_le_bytes());
        z.extend(1u64.to_le_bytes());
        z.extend(dir_len.to_le_bytes());
        z.extend(dir.to_le_bytes());
        z.extend(b"PK\x06\x07\0\0\0\0");
        z.extend(end.to_le_bytes());
        z.extend(1u32.to_le_bytes());
        z.extend(b"PK\x05\x06\0\0\0\0");
        z.extend([0xff; 12]);
        z.extend([0; 2]);
        z
    }

    #[test]
    fn zip64_records_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.pth");
        let data = b"the bytes of a tensor";
        let mut z = zip64(data);
        std::fs::write(&path, &z).unwrap();
        check_crcs(&path).unwrap();
        let mut f = File::open(&path).unwrap();
        let r = records(&mut f, z.len() as u64).unwrap();
        assert_eq!(
            (r.len(), r[0].name.as_str(), r[0].size, r[0].local_header),
            (1, "w/data/0", data.len() as u64, 0)
        );
        let at = z.windows(data.len()).position(|w| w == data).unwrap();
        z[at] ^= 1;
        std::fs::write(&path, &z).unwrap();
        let err = check_crcs(&path).unwrap_err();
        assert!(
            format!("{err:#}").contains("w/data/0 is damaged"),
            "{err:#}"
        );
    }
}
