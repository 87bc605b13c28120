//! Attention masks as descriptions: which keys each query sees, written
//! once and read two ways. [`Mask::visible`] answers one (query, key)
//! pair (the f64 reference and the element masks come from it);
//! [`Mask::block`] classifies a whole rectangle of pairs as empty, full or
//! partial without visiting it where the mask's structure allows, which is
//! what makes block tables of long sequences cheap
//! ([`super::block_table`]).
//!
//! Positions are absolute: query `q` is row `q` of the query sequence,
//! key `k` row `k` of the key sequence (the same numbering when they are
//! one sequence). Segment ids are applied on top of a mask by the kernel
//! (a pair is visible only within one segment), not here.
//!
//! ```
//! use kernels::attention::mask::Mask;
//! // Llama 4's local layers: causal inside chunks of 8192.
//! let m = Mask::ChunkedCausal { chunk: 8192 };
//! assert!(m.visible(8193, 8192) && !m.visible(8192, 8191));
//! // Prefix-LM: the first 16 keys are seen by every query, the rest causally.
//! let p = Mask::Prefix { len: 16 };
//! assert!(p.visible(3, 15) && !p.visible(20, 21));
//! ```

use std::sync::Arc;

/// Which keys a query sees (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mask {
    /// Every key.
    Full,
    /// Keys `k ≤ q + offset` (offset 0: the usual causal mask).
    Causal {
        /// How far past the diagonal keys stay visible.
        offset: i64,
    },
    /// Keys `q − left ≤ k ≤ q + right`; `None` leaves a side open
    /// (`left: Some(w - 1), right: Some(0)` is a causal sliding window
    /// of `w`).
    Local {
        /// Keys visible before the query.
        left: Option<u64>,
        /// Keys visible after it.
        right: Option<u64>,
    },
    /// Causal within consecutive chunks of `chunk` positions: `k ≤ q` and
    /// `k / chunk == q / chunk`.
    ChunkedCausal {
        /// The chunk length (at least 1).
        chunk: u64,
    },
    /// The first `len` keys are seen by every query (the bidirectional
    /// prefix), the rest causally.
    Prefix {
        /// The prefix length.
        len: u64,
    },
    /// An explicit `[rows, cols]` boolean array, row-major; pairs outside
    /// it are not visible.
    Explicit {
        /// Query rows it covers.
        rows: usize,
        /// Key columns it covers.
        cols: usize,
        /// `rows · cols` visibilities.
        data: Arc<Vec<bool>>,
    },
    /// Visible in both.
    And(Box<Mask>, Box<Mask>),
    /// Visible in either.
    Or(Box<Mask>, Box<Mask>),
}

/// How much of a rectangle of (query, key) pairs a mask leaves visible.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockKind {
    /// No pair: the step is skipped and fetches nothing new.
    Empty,
    /// Some pairs (or not known to be all or none): computed with its
    /// element mask.
    Partial,
    /// Every pair: computed without an element mask.
    Full,
}

/// A mask whose explicit array has the wrong number of elements.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("an explicit mask of [{rows}, {cols}] needs {} visibilities but has {found}; give one per (query, key) pair, row-major", rows * cols)]
pub struct MaskShapeError {
    /// Its rows.
    pub rows: usize,
    /// Its columns.
    pub cols: usize,
    /// How many it has.
    pub found: usize,
}

impl Mask {
    /// An explicit mask, checked: `data` has one visibility per pair.
    pub fn explicit(rows: usize, cols: usize, data: Vec<bool>) -> Result<Mask, MaskShapeError> {
        if data.len() != rows.saturating_mul(cols) {
            return Err(MaskShapeError {
                rows,
                cols,
                found: data.len(),
            });
        }
        Ok(Mask::Explicit {
            rows,
            cols,
            data: Arc::new(data),
        })
    }

    /// Visible in this mask and in `other`.
    pub fn and(self, other: Mask) -> Mask {
        Mask::And(Box::new(self), Box::new(other))
    }

    /// Visible in this mask or in `other`.
    pub fn or(self, other: Mask) -> Mask {
        Mask::Or(Box::new(self), Box::new(other))
    }

    /// Whether query `q` sees key `k`: the reference every table and
    /// kernel is checked against.
    pub fn visible(&self, q: u64, k: u64) -> bool {
        let (qi, ki) = (q as i128, k as i128);
        match self {
            Mask::Full => true,
            Mask::Causal { offset } => ki <= qi + *offset as i128,
            Mask::Local { left, right } => {
                left.is_none_or(|l| ki >= qi - l as i128)
                    && right.is_none_or(|r| ki <= qi + r as i128)
            }
            Mask::ChunkedCausal { chunk } => {
                let c = (*chunk).max(1);
                k <= q && k / c == q / c
            }
            Mask::Prefix { len } => k < *len || k <= q,
            Mask::Explicit { rows, cols, data } => {
                (q as usize) < *rows && (k as usize) < *cols && data[q as usize * cols + k as usize]
            }
            Mask::And(a, b) => a.visible(q, k) && b.visible(q, k),
            Mask::Or(a, b) => a.visible(q, k) || b.visible(q, k),
        }
    }

    /// Whether visibility is a function of the two positions alone (no
    /// explicit array anywhere in it): the kernels then compute it from
    /// positions on partial steps and read no element masks, as splash
    /// attention does with its computable masks.
    pub fn computable(&self) -> bool {
        match self {
            Mask::Explicit { .. } => false,
            Mask::And(a, b) | Mask::Or(a, b) => a.computable() && b.computable(),
            _ => true,
        }
    }

    /// The kind of the rectangle of queries `q0..q1` and keys `k0..k1`
    /// (both non-empty), from the mask's structure. `Partial` may be
    /// returned for a rectangle that is in fact all or nothing (an
    /// explicit array, a chunk boundary): [`super::block_table`] settles
    /// those by their elements. `Empty` and `Full` are exact.
    pub fn block(&self, q0: u64, q1: u64, k0: u64, k1: u64) -> BlockKind {
        // q − k over the rectangle runs from q0 − (k1 − 1) to (q1 − 1) − k0.
        let (lo, hi) = (q0 as i128 - (k1 as i128 - 1), q1 as i128 - 1 - k0 as i128);
        let band = |min: Option<i128>, max: Option<i128>| -> BlockKind {
            // Visible iff min ≤ q − k ≤ max.
            let empty = max.is_some_and(|m| lo > m) || min.is_some_and(|m| hi < m);
            let full = max.is_none_or(|m| hi <= m) && min.is_none_or(|m| lo >= m);
            if empty {
                BlockKind::Empty
            } else if full {
                BlockKind::Full
            } else {
                BlockKind::Partial
            }
        };
        match self {
            Mask::Full => BlockKind::Full,
            Mask::Causal { offset } => band(Some(-(*offset as i128)), None),
            Mask::Local { left, right } => {
                band(right.map(|r| -(r as i128)), left.map(|l| l as i128))
            }
            Mask::ChunkedCausal { chunk } => {
                let c = (*chunk).max(1);
                let causal = band(Some(0), None);
                let (qc0, qc1, kc0, kc1) = (q0 / c, (q1 - 1) / c, k0 / c, (k1 - 1) / c);
                if causal == BlockKind::Empty || kc1 < qc0 || kc0 > qc1 {
                    BlockKind::Empty
                } else if causal == BlockKind::Full && qc0 == qc1 && kc0 == kc1 && qc0 == kc0 {
                    BlockKind::Full
                } else {
                    BlockKind::Partial
                }
            }
            Mask::Prefix { len } => {
                let keys = if k1 <= *len {
                    BlockKind::Full
                } else if k0 >= *len {
                    BlockKind::Empty
                } else {
                    BlockKind::Partial
                };
                or(keys, band(Some(0), None))
            }
            Mask::Explicit { rows, cols, .. } => {
                if q0 as usize >= *rows || k0 as usize >= *cols {
                    BlockKind::Empty
                } else {
                    BlockKind::Partial
                }
            }
            Mask::And(a, b) => and(a.block(q0, q1, k0, k1), b.block(q0, q1, k0, k1)),
            Mask::Or(a, b) => or(a.block(q0, q1, k0, k1), b.block(q0, q1, k0, k1)),
        }
    }
}

fn and(a: BlockKind, b: BlockKind) -> BlockKind {
    match (a, b) {
        (BlockKind::Empty, _) | (_, BlockKind::Empty) => BlockKind::Empty,
        (BlockKind::Full, x) | (x, BlockKind::Full) => x,
        _ => BlockKind::Partial,
    }
}

fn or(a: BlockKind, b: BlockKind) -> BlockKind {
    match (a, b) {
        (BlockKind::Full, _) | (_, BlockKind::Full) => BlockKind::Full,
        (BlockKind::Empty, x) | (x, BlockKind::Empty) => x,
        _ => BlockKind::Partial,
    }
}

/// One mask per head (splash attention's `MultiHeadMask`): local heads and
/// global heads in one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiHeadMask {
    /// Head `h`'s mask.
    pub heads: Vec<Mask>,
}

impl MultiHeadMask {
    /// The same mask on `heads` heads.
    pub fn uniform(mask: Mask, heads: usize) -> MultiHeadMask {
        MultiHeadMask {
            heads: vec![mask; heads],
        }
    }

    /// Whether every head's mask is [`Mask::computable`].
    pub fn computable(&self) -> bool {
        self.heads.iter().all(Mask::computable)
    }

    /// The masks of `heads` heads from text: one [`Mask`] for all of them,
    /// or one per head separated by `;`.
    ///
    /// ```
    /// use kernels::attention::mask::{Mask, MultiHeadMask};
    /// let m = MultiHeadMask::parse("local:127:0;causal", 2).unwrap();
    /// assert_eq!(m.heads[1], Mask::Causal { offset: 0 });
    /// assert!(MultiHeadMask::parse("causal;causal", 4).is_err());
    /// ```
    pub fn parse(text: &str, heads: usize) -> Result<MultiHeadMask, MaskParseError> {
        let masks = parse_heads(text)?;
        match masks.len() {
            1 => Ok(MultiHeadMask::uniform(masks[0].clone(), heads)),
            n if n == heads => Ok(MultiHeadMask { heads: masks }),
            n => Err(MaskParseError {
                text: text.to_string(),
                why: format!(
                    "it names {n} head masks but there are {heads} heads; give one mask or one per head (`;`-separated)"
                ),
            }),
        }
    }
}

/// The `;`-separated masks of `text`, in order.
fn parse_heads(text: &str) -> Result<Vec<Mask>, MaskParseError> {
    text.split(';').map(str::parse).collect()
}

/// A mask description that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "mask `{text}`: {why}; write full, causal[:OFFSET], local:LEFT:RIGHT (`-` for open), chunked:CHUNK or prefix:LEN, combined with & and | (left to right)"
)]
pub struct MaskParseError {
    /// The text.
    pub text: String,
    /// What is wrong.
    pub why: String,
}

impl std::str::FromStr for Mask {
    type Err = MaskParseError;

    /// `causal`, `causal:-2`, `local:127:0`, `local:-:0`, `chunked:8192`,
    /// `prefix:16`, `full`, and `a&b`, `a|b` of them, left to right.
    fn from_str(text: &str) -> Result<Mask, MaskParseError> {
        let err = |why: String| MaskParseError {
            text: text.to_string(),
            why,
        };
        let mut out: Option<Mask> = None;
        let mut op = None;
        let mut rest = text.trim();
        loop {
            let end = rest.find(['&', '|']).unwrap_or(rest.len());
            let term = rest[..end].trim();
            let parts: Vec<&str> = term.split(':').map(str::trim).collect();
            let num = |s: &str| -> Result<u64, MaskParseError> {
                s.parse()
                    .map_err(|_| err(format!("`{s}` is not a whole number")))
            };
            let open = |s: &str| -> Result<Option<u64>, MaskParseError> {
                if s == "-" { Ok(None) } else { num(s).map(Some) }
            };
            let m = match parts.as_slice() {
                ["full"] => Mask::Full,
                ["causal"] => Mask::Causal { offset: 0 },
                ["causal", o] => Mask::Causal {
                    offset: o
                        .parse()
                        .map_err(|_| err(format!("`{o}` is not an offset")))?,
                },
                ["local", l, r] => Mask::Local {
                    left: open(l)?,
                    right: open(r)?,
                },
                ["chunked", c] => {
                    let chunk = num(c)?;
                    if chunk == 0 {
                        return Err(err("a chunk of 0 positions".into()));
                    }
                    Mask::ChunkedCausal { chunk }
                }
                ["prefix", n] => Mask::Prefix { len: num(n)? },
                _ => return Err(err(format!("`{term}` is no mask"))),
            };
            out = Some(match (out, op) {
                (None, _) => m,
                (Some(a), Some('&')) => a.and(m),
                (Some(a), _) => a.or(m),
            });
            if end == rest.len() {
                break;
            }
            op = rest[end..].chars().next();
            rest = &rest[end + 1..];
        }
        out.ok_or_else(|| err("empty".into()))
    }
}
