//! Mutations of a generated kernel's text: numbers and words swapped for
//! others at seeded places, so the file readers and verifier see text a
//! grammar never writes.

use kernel_ir::SplitMix64;

use super::Case;

const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "7",
    "129",
    "2147483647",
    "2147483648",
    "-9223372036854775808",
    "9223372036854775807",
    "99999999999999999999",
    "1.0e40",
    "NaN",
    "-inf",
    "4000000000",
];

const WORDS: &[&str] = &[
    "add",
    "exp",
    "load",
    "store",
    "reduce",
    "dot_general",
    "for",
    "if",
    "yield",
    "f32",
    "bf16",
    "i32",
    "i8",
    "bool",
    "parallel",
    "arbitrary",
    "scope",
    "iota",
    "cmp",
    "convert",
    "}",
    "else",
    "mask",
    "%0",
    "@x0",
    "@acc",
    "g0",
    "g1",
    "[",
    "]",
];

/// `case` with 1 to 3 mutations of its text: number and word
/// substitutions, deleted, doubled and swapped lines, a truncation or a
/// byte flip.
pub fn mutate(mut case: Case, seed: u64) -> Case {
    let mut c = SplitMix64(seed ^ 0x5eed_f00d);
    for _ in 0..1 + c.below(3) {
        let mut lines: Vec<String> = case.text.lines().map(String::from).collect();
        let n = lines.len();
        let l = c.below(n);
        let what = match c.below(8) {
            0 | 1 => {
                // A number token replaced.
                let tokens = number_spans(&lines[l]);
                if tokens.is_empty() {
                    continue;
                }
                let (s, e) = c.pick(&tokens);
                let new = c.pick(NUMBERS);
                lines[l].replace_range(s..e, new);
                format!("line {}: number -> {new}", l + 1)
            }
            2 => {
                let words: Vec<(usize, usize)> = word_spans(&lines[l]);
                if words.is_empty() {
                    continue;
                }
                let (s, e) = c.pick(&words);
                let new = c.pick(WORDS);
                lines[l].replace_range(s..e, new);
                format!("line {}: word -> {new}", l + 1)
            }
            3 => {
                lines.remove(l);
                format!("line {} deleted", l + 1)
            }
            4 => {
                let dup = lines[l].clone();
                lines.insert(l, dup);
                format!("line {} doubled", l + 1)
            }
            5 => {
                let m = c.below(n);
                lines.swap(l, m);
                format!("lines {} and {} swapped", l + 1, m + 1)
            }
            6 => {
                let cut = c.below(case.text.len());
                let cut = (0..=cut)
                    .rev()
                    .find(|&i| case.text.is_char_boundary(i))
                    .unwrap_or(0);
                case.text.truncate(cut);
                case.mutations.push(format!("truncated at byte {cut}"));
                continue;
            }
            _ => {
                let mut bytes = case.text.into_bytes();
                let at = c.below(bytes.len());
                let b = c.pick(&[b'\0', b'\r', 0xff, b'%', b'@', b'{', b'9', b'-', b'x']);
                bytes[at] = b;
                case.text = String::from_utf8_lossy(&bytes).into_owned();
                case.mutations.push(format!("byte {at} -> {b:#04x}"));
                continue;
            }
        };
        case.text = lines.join("\n") + "\n";
        case.mutations.push(what);
    }
    case
}

fn spans(
    line: &str,
    inside: impl Fn(char) -> bool,
    starts: impl Fn(char) -> bool,
) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, ch) in line.char_indices().chain([(line.len(), ' ')]) {
        match start {
            None if starts(ch) => start = Some(i),
            Some(s) if !inside(ch) => {
                out.push((s, i));
                start = if starts(ch) { Some(i) } else { None };
            }
            _ => {}
        }
    }
    out
}

fn number_spans(line: &str) -> Vec<(usize, usize)> {
    spans(
        line,
        |ch| ch.is_ascii_digit() || ch == '.',
        |ch| ch.is_ascii_digit(),
    )
}

fn word_spans(line: &str) -> Vec<(usize, usize)> {
    spans(
        line,
        |ch| ch.is_ascii_alphanumeric() || ch == '_',
        |ch| ch.is_ascii_alphabetic(),
    )
}
