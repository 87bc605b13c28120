//! Text from outside (file paths, kernel and operand names, attribute
//! values) as it may appear inside the text Tessera generates: one function
//! per generated language, and every generator goes through them.
//!
//! A `.kir` file's path becomes the source location of every op read from
//! it, and locations are written into the generated Triton program as
//! comments. A path holding a newline would end the comment, and the text
//! after it would run as Python when the program is loaded. So nothing from
//! outside is written raw:
//!
//! * Python ([`python_comment`], [`python_str`]): only printable ASCII
//!   stays as it is; a backslash, a quote (in a literal), every control
//!   character, every non-ASCII character (Python's `str.splitlines`, which
//!   `inspect` and so Triton's front end use, also ends lines at `\x0b`,
//!   `\x0c`, `\x1c`–`\x1e`, `\x85`, U+2028 and U+2029) are written as Python
//!   escapes (`\\`, `\n`, `\xNN`, `\uNNNN`, `\UNNNNNNNN`), so the result is
//!   one line of ASCII, and a literal means exactly the string it quotes.
//! * JSON ([`json_str`]): a string literal with `"`, `\` and every control
//!   character (C0, DEL, C1) escaped, and U+2028, U+2029, which some
//!   readers take for line ends.
//! * MLIR: names and locations go through MLIR's C API (string attributes,
//!   `Location::new`), whose printer escapes them; no MLIR text is built
//!   from outside text.
//! * C and LLVM symbol names: made from kernel names, which the verifier
//!   holds to ASCII identifiers (`[A-Za-z_][A-Za-z0-9_]*`).
//!
//! ```
//! use kernel_ir::quote::{json_str, python_comment, python_str};
//!
//! let path = "evil\nimport os  # .kir";
//! assert_eq!(python_comment(path), r"evil\nimport os  # .kir");
//! assert_eq!(python_str("a\"b"), r#""a\"b""#);
//! assert_eq!(json_str("a\u{1}"), r#""a\u0001""#);
//! ```

use std::fmt::Write;

/// Pushes `c` as a Python escape sequence.
fn python_escape(out: &mut String, c: char) {
    let _ = match c {
        '\\' => write!(out, "\\\\"),
        '\n' => write!(out, "\\n"),
        '\r' => write!(out, "\\r"),
        '\t' => write!(out, "\\t"),
        c if (c as u32) < 0x100 => write!(out, "\\x{:02x}", c as u32),
        c if (c as u32) < 0x10000 => write!(out, "\\u{:04x}", c as u32),
        c => write!(out, "\\U{:08x}", c as u32),
    };
}

/// Whether `c` is written as itself in generated Python: printable ASCII
/// but the backslash.
fn python_plain(c: char) -> bool {
    matches!(c, ' '..='~') && c != '\\'
}

/// `s` as the text of a Python comment: one line of printable ASCII, with
/// everything else (line ends, control characters, non-ASCII, the
/// backslash) as a Python escape, so nothing in `s` can end the comment.
pub fn python_comment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if python_plain(c) {
            out.push(c);
        } else {
            python_escape(&mut out, c);
        }
    }
    out
}

/// `s` as a Python string literal (double-quoted, ASCII): evaluated, it is
/// `s` again, character for character.
pub fn python_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            c if python_plain(c) => out.push(c),
            c => python_escape(&mut out, c),
        }
    }
    out.push('"');
    out
}

/// `s` as a JSON string literal: `"`, `\` and control characters escaped
/// (and U+2028, U+2029), everything else as it is (JSON is UTF-8). Any
/// JSON reader reads it back as `s`.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        let _ = match c {
            '"' => write!(out, "\\\""),
            '\\' => write!(out, "\\\\"),
            '\n' => write!(out, "\\n"),
            '\r' => write!(out, "\\r"),
            '\t' => write!(out, "\\t"),
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                write!(out, "\\u{:04x}", c as u32)
            }
            c => {
                out.push(c);
                Ok(())
            }
        };
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a Python literal written by [`python_str`] back (the escapes
    /// it writes, and only those).
    fn read_python_str(lit: &str) -> String {
        let body = lit
            .strip_prefix('"')
            .and_then(|b| b.strip_suffix('"'))
            .expect("quoted");
        let mut out = String::new();
        let mut chars = body.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                assert!(c != '"', "an unescaped quote in {lit:?}");
                out.push(c);
                continue;
            }
            let hex = |chars: &mut std::str::Chars, n| {
                let h: String = chars.take(n).collect();
                char::from_u32(u32::from_str_radix(&h, 16).unwrap()).unwrap()
            };
            match chars.next().unwrap() {
                '\\' => out.push('\\'),
                '"' => out.push('"'),
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                'x' => out.push(hex(&mut chars, 2)),
                'u' => out.push(hex(&mut chars, 4)),
                'U' => out.push(hex(&mut chars, 8)),
                e => panic!("unknown escape \\{e} in {lit:?}"),
            }
        }
        out
    }

    fn hostile() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let pieces = prop_oneof![
            Just("\n".to_string()),
            Just("\r\n".to_string()),
            Just("\u{2028}".to_string()),
            Just("\u{85}".to_string()),
            Just("\x0c".to_string()),
            Just("\0".to_string()),
            Just("\"".to_string()),
            Just("'".to_string()),
            Just("\\".to_string()),
            Just("#".to_string()),
            Just("import os; os._exit(3)".to_string()),
            any::<char>().prop_map(String::from),
            "[a-z/._ ]{0,8}",
        ];
        proptest::collection::vec(pieces, 0..24).prop_map(|v| v.concat())
    }

    proptest::proptest! {
        #[test]
        fn a_python_comment_is_one_line_of_printable_ascii(s in hostile()) {
            let c = python_comment(&s);
            proptest::prop_assert!(c.chars().all(|c| (' '..='~').contains(&c)), "{c:?}");
            proptest::prop_assert_eq!(c.lines().count(), usize::from(!c.is_empty()));
        }

        #[test]
        fn a_python_literal_means_its_string(s in hostile()) {
            let lit = python_str(&s);
            proptest::prop_assert!(lit.chars().all(|c| (' '..='~').contains(&c)), "{lit:?}");
            proptest::prop_assert_eq!(read_python_str(&lit), s);
        }

        #[test]
        fn a_json_literal_has_no_raw_control_character(s in hostile()) {
            let lit = json_str(&s);
            proptest::prop_assert!(
                !lit.chars().any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}'),
                "{lit:?}"
            );
            let back: String = serde_json::from_str(&lit).unwrap();
            proptest::prop_assert_eq!(back, s);
        }
    }

    #[test]
    fn ten_thousand_characters_stay_one_line() {
        let s = "\u{2029}x".repeat(5_000);
        assert_eq!(python_comment(&s).lines().count(), 1);
        assert_eq!(python_str(&s).lines().count(), 1);
        assert_eq!(json_str(&s).lines().count(), 1);
    }
}
