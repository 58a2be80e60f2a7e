//! JSON text the way Python's `json.dumps` writes it with its defaults ([`python_json`]): `", "` and `": "`
//! between items, floats as Python's `repr`, and every character outside printable ASCII escaped. MLPerf's
//! `:::MLLOG` lines ([`crate::train::mllog`]) and `rn50 export --json`'s report ([`crate::export`]) are
//! written with it.
use std::io::{self, Write};

use serde::Serialize;

/// `value` as JSON text the way Python's `json.dumps(value)` writes it, which mllog uses ([`PythonJson`]).
pub fn python_json(value: &impl Serialize) -> serde_json::Result<String> {
    let mut text = Vec::new();
    value.serialize(&mut serde_json::Serializer::with_formatter(
        &mut text, PythonJson,
    ))?;
    Ok(String::from_utf8(text).expect("every character outside printable ASCII is escaped"))
}

/// JSON as Python's `json.dumps` writes it with its defaults, as mllog does: `", "` and `": "` between items
/// (grep-based tools look for `"key": "run_stop"`), floats as Python's `repr` ([`python_float`]), and every
/// character outside printable ASCII as `\uXXXX` (ensure_ascii).
struct PythonJson;

impl serde_json::ser::Formatter for PythonJson {
    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.begin_array_value(w, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }

    fn write_f64<W: ?Sized + Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(python_float(value).as_bytes())
    }

    /// The characters serde_json does not escape itself (it writes `\"`, `\\`, `\n`... and the other controls
    /// as `\u00XX`, as Python does).
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut units = [0u16; 2];
        for c in fragment.chars() {
            if (' '..='~').contains(&c) {
                w.write_all(&[c as u8])?;
            } else {
                for u in c.encode_utf16(&mut units) {
                    write!(w, "\\u{u:04x}")?;
                }
            }
        }
        Ok(())
    }
}

/// A finite `x` as Python's `repr`: the shortest digits that read back as `x` (Rust's `{:e}` has the same), in
/// positional notation when the decimal point falls within 4 places before the first digit and 16 after it, with
/// at least one decimal (`2.0`, `0.0001`), else in exponent notation with a signed exponent of two digits or more
/// (`1e-05`, `1.5e+16`).
fn python_float(x: f64) -> String {
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} writes an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits = mantissa.replace('.', "");
    // Python's decpt: the decimal point comes after this many digits.
    let point = exp + 1;
    if point <= -4 || point > 16 {
        let rest = match &digits[1..] {
            "" => String::new(),
            r => format!(".{r}"),
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{}{rest}e{exp_sign}{:02}", &digits[..1], exp.abs())
    } else if point <= 0 {
        format!(
            "{sign}0.{}{digits}",
            "0".repeat(point.unsigned_abs() as usize)
        )
    } else {
        let point = point as usize;
        match point < digits.len() {
            true => format!("{sign}{}.{}", &digits[..point], &digits[point..]),
            false => format!("{sign}{digits}{}.0", "0".repeat(point - digits.len())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_written_as_python_repr() {
        for (x, want) in [
            (2.0, "2.0"),
            (0.1, "0.1"),
            (-0.5, "-0.5"),
            (0.0001, "0.0001"),
            (1e-05, "1e-05"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123.456, "123.456"),
        ] {
            assert_eq!(python_float(x), want, "{x}");
        }
    }

    #[test]
    fn separators_and_non_ascii_are_as_json_dumps() {
        let v = serde_json::json!({"a": [1, 2.5, "\u{e9}\n"], "b": {"c": null}});
        assert_eq!(
            python_json(&v).unwrap(),
            r#"{"a": [1, 2.5, "\u00e9\n"], "b": {"c": null}}"#
        );
    }
}
