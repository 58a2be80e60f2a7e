//! Class names read from files (weights' metadata, checkpoints), as printed: each name's control characters
//! escaped, so that a name cannot colour the terminal or forge a line of rn50's output.
use std::borrow::Cow;

/// `names` to print in a message, as a list (`["cat", "dog"]`): each quoted with its control characters escaped
/// (Rust's `{:?}`), so that a name read from a file cannot colour the terminal or forge a line; the first ten and
/// the count of the rest when there are more.
pub fn names_list(names: &[String]) -> String {
    let shown: Vec<String> = names.iter().take(10).map(|n| format!("{n:?}")).collect();
    match names.len() {
        n if n > 10 => format!("[{}, ... {} more]", shown.join(", "), n - 10),
        _ => format!("[{}]", shown.join(", ")),
    }
}

/// `name` as printed on its own (`rn50 classify`'s lines): its control characters escaped as `{:?}` escapes them
/// (`\u{1b}`, `\n`), the rest as it is.
pub fn printable(name: &str) -> Cow<'_, str> {
    if !name.chars().any(char::is_control) {
        return Cow::Borrowed(name);
    }
    Cow::Owned(
        name.chars()
            .map(|c| match c.is_control() {
                true => c.escape_debug().to_string(),
                false => c.to_string(),
            })
            .collect(),
    )
}
