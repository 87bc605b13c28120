//! The dot micro-kernel's register tile: how many rows of accumulators
//! and how wide, the one choice of the JIT's code that depends most on the
//! CPU (its register file, its load ports, its cache sizes).
//!
//! [`DotTiling::candidates`] lists the tiles that fit a register file;
//! [`crate::HostTuning`] measures them at first use on each [`DotClass`]'s
//! probe and keeps, per class, the fastest where it beats the register
//! rule ([`DotTiling::heuristic`]) by a margin: one tile for every dot
//! was the wrong granularity (a tile that won attention's probe ran a
//! 1024³ matmul 2.3× slower on an AVX-512 CPU).

use std::fmt;
use std::str::FromStr;

use crate::host::cpu::VectorRegisters;

/// A register tile of the dot micro-kernel: `rows` rows of C, each
/// `width_bytes` wide, held in vector registers over the whole k loop
/// (the accumulators), with one rhs vector load per k step and one
/// broadcast lhs element per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DotTiling {
    /// Rows of the main register tile (a tail of 8/4/2/1-row tiles covers
    /// the rest of `m`).
    pub rows: usize,
    /// Bytes of accumulators per row (a whole number of vector registers;
    /// narrower where `n` does not divide it).
    pub width_bytes: usize,
}

impl DotTiling {
    /// The tile chosen without measuring: two registers per row and as
    /// many rows as fit beside two rhs registers and a broadcast, at most
    /// 12 (12 × 2 of AVX-512's 32 registers measured faster than 8 or 14
    /// rows on an Ice Lake; 6 × 2 of AVX2's 16 is the most that fits).
    pub fn heuristic(r: VectorRegisters) -> DotTiling {
        DotTiling {
            rows: ((r.count - 3) / 2).min(12),
            width_bytes: 2 * r.bytes,
        }
    }

    /// Accumulator registers the tile needs on `r`.
    pub fn accumulators(self, r: VectorRegisters) -> usize {
        self.rows * self.width_bytes.div_ceil(r.bytes)
    }

    /// Whether the accumulators, the rhs registers of one k step and a
    /// broadcast fit in `r`'s register file (else LLVM spills them).
    pub fn fits(self, r: VectorRegisters) -> bool {
        self.rows >= 1
            && self.width_bytes >= r.bytes
            && self.width_bytes.is_multiple_of(r.bytes)
            // Strictly fewer: one register is left for the broadcast.
            && self.accumulators(r) + self.width_bytes / r.bytes < r.count
    }

    /// The tiles worth measuring on `r`: one, two and four registers
    /// wide, each with the most rows that fit, one fewer, and about two
    /// thirds of that (fewer accumulators and more loads per FMA, but
    /// registers left for LLVM's address arithmetic), and the heuristic
    /// tile. Every one [`fits`](DotTiling::fits).
    pub fn candidates(r: VectorRegisters) -> Vec<DotTiling> {
        let mut out = vec![DotTiling::heuristic(r)];
        for regs in [1, 2, 4] {
            let most = r.count.saturating_sub(regs + 1) / regs;
            for rows in [most, most.saturating_sub(1), (2 * most).div_ceil(3)] {
                let t = DotTiling {
                    rows,
                    width_bytes: regs * r.bytes,
                };
                if rows >= 2 && t.fits(r) && !out.contains(&t) {
                    out.push(t);
                }
            }
        }
        out
    }

    /// Lanes of `elem_bytes`-byte elements in one row of the tile.
    pub fn lanes(self, elem_bytes: usize) -> usize {
        self.width_bytes / elem_bytes.max(1)
    }
}

impl fmt::Display for DotTiling {
    /// `ROWSxLANES`, lanes counted in f32: `6x16`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.rows, self.lanes(4))
    }
}

/// Why a register-tile setting does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TilingError {
    /// Not `ROWSxLANES` in range.
    #[error(
        "`{0}` is not a register tile; write ROWSxLANES, rows 1 to 32 and f32 lanes a power of two from 4 to 64, e.g. 6x16"
    )]
    Tile(String),
    /// Not one of [`DotClass::ALL`].
    #[error("`{given}` is not a dot class; the classes are {classes}")]
    Class {
        /// What was written.
        given: String,
        /// The classes, comma-separated.
        classes: String,
    },
    /// A pair without `=`.
    #[error("`{0}` is not CLASS=ROWSxLANES (e.g. deep-wide=6x16)")]
    Pair(String),
    /// The environment's setting (`TESSERA_HOST_TUNING`) is malformed.
    #[error(
        "{env}: {0}; give ROWSxLANES, CLASS=ROWSxLANES pairs separated by commas, or `default`",
        env = crate::TUNING_ENV
    )]
    Setting(Box<TilingError>),
}

impl FromStr for DotTiling {
    type Err = TilingError;

    /// Reads `ROWSxLANES` (lanes of f32, a power of two from 4 to 64;
    /// rows 1 to 32), the form [`DotTiling`]'s `Display` writes.
    fn from_str(s: &str) -> Result<DotTiling, TilingError> {
        let bad = || TilingError::Tile(s.to_string());
        let (r, l) = s.trim().split_once('x').ok_or_else(bad)?;
        let rows: usize = r.parse().map_err(|_| bad())?;
        let lanes: usize = l.parse().map_err(|_| bad())?;
        if !(1..=32).contains(&rows) || !(4..=64).contains(&lanes) || !lanes.is_power_of_two() {
            return Err(bad());
        }
        Ok(DotTiling {
            rows,
            width_bytes: 4 * lanes,
        })
    }
}

/// Which dots share a register tile: by contraction depth `k` and output
/// width `n` (the rhs's free elements), each side of 128 (attention's
/// head dim). What makes one tile win differs between them: a deep dot
/// streams its lhs rows over many k steps, a narrow one has few rhs
/// panels to reuse each packed lhs row on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DotClass {
    /// `k ≤ 128`, `n ≤ 128`: the backward's `dS·k` and `dSᵀ·q` at small
    /// blocks, decode-sized products.
    ShallowNarrow,
    /// `k ≤ 128`, `n > 128`: attention's scores `q·kᵀ`.
    ShallowWide,
    /// `k > 128`, `n ≤ 128`: attention's `p·v`, the backward's products
    /// over a block of 256 rows.
    DeepNarrow,
    /// `k > 128`, `n > 128`: matmul blocks.
    DeepWide,
}

impl DotClass {
    /// Every class, in the order files and tables list them.
    pub const ALL: [DotClass; 4] = [
        DotClass::ShallowNarrow,
        DotClass::ShallowWide,
        DotClass::DeepNarrow,
        DotClass::DeepWide,
    ];

    /// The class of a dot contracting `k` elements into `n` output
    /// columns.
    pub fn of(k: usize, n: usize) -> DotClass {
        match (k > 128, n > 128) {
            (false, false) => DotClass::ShallowNarrow,
            (false, true) => DotClass::ShallowWide,
            (true, false) => DotClass::DeepNarrow,
            (true, true) => DotClass::DeepWide,
        }
    }

    /// Its name in files, tables and `TESSERA_HOST_TUNING`.
    pub fn name(self) -> &'static str {
        match self {
            DotClass::ShallowNarrow => "shallow-narrow",
            DotClass::ShallowWide => "shallow-wide",
            DotClass::DeepNarrow => "deep-narrow",
            DotClass::DeepWide => "deep-wide",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for DotClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DotClass {
    type Err = TilingError;

    fn from_str(s: &str) -> Result<DotClass, TilingError> {
        DotClass::ALL
            .into_iter()
            .find(|c| c.name() == s.trim())
            .ok_or_else(|| {
                let names: Vec<&str> = DotClass::ALL.iter().map(|c| c.name()).collect();
                TilingError::Class {
                    given: s.to_string(),
                    classes: names.join(", "),
                }
            })
    }
}

/// A register tile for each [`DotClass`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DotTilings([DotTiling; 4]);

impl DotTilings {
    /// The same tile for every class.
    pub fn uniform(t: DotTiling) -> DotTilings {
        DotTilings([t; 4])
    }

    /// The register rule's tile for every class.
    pub fn heuristic(r: VectorRegisters) -> DotTilings {
        DotTilings::uniform(DotTiling::heuristic(r))
    }

    /// The tile of `class`.
    pub fn get(&self, class: DotClass) -> DotTiling {
        self.0[class.index()]
    }

    /// Sets the tile of `class`.
    pub fn set(&mut self, class: DotClass, t: DotTiling) {
        self.0[class.index()] = t;
    }

    /// The tile for a dot contracting `k` elements into `n` columns.
    pub fn for_dot(&self, k: usize, n: usize) -> DotTiling {
        self.get(DotClass::of(k, n))
    }

    /// Whether every class's tile fits `r`.
    pub fn fits(&self, r: VectorRegisters) -> bool {
        self.0.iter().all(|t| t.fits(r))
    }

    /// Reads a `TESSERA_HOST_TUNING` value: `ROWSxLANES` for every class,
    /// or `CLASS=ROWSxLANES` pairs separated by commas, the classes not
    /// named keeping the register rule's tile on `r`.
    pub fn parse_setting(v: &str, r: VectorRegisters) -> Result<DotTilings, TilingError> {
        if !v.contains('=') {
            return v.parse().map(DotTilings::uniform);
        }
        let mut out = DotTilings::heuristic(r);
        for pair in v.split(',') {
            let (class, tile) = pair
                .split_once('=')
                .ok_or_else(|| TilingError::Pair(pair.to_string()))?;
            out.set(class.parse()?, tile.parse()?);
        }
        Ok(out)
    }
}

impl fmt::Display for DotTilings {
    /// `CLASS ROWSxLANES` for each class, comma-separated; `ROWSxLANES`
    /// alone when every class has the same tile.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.iter().all(|t| *t == self.0[0]) {
            return write!(f, "{}", self.0[0]);
        }
        let parts: Vec<String> = DotClass::ALL
            .iter()
            .map(|c| format!("{c} {}", self.get(*c)))
            .collect();
        f.write_str(&parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AVX512: VectorRegisters = VectorRegisters {
        bytes: 64,
        count: 32,
        isa: "avx512",
    };
    const AVX2: VectorRegisters = VectorRegisters {
        bytes: 32,
        count: 16,
        isa: "avx2",
    };
    const NEON: VectorRegisters = VectorRegisters {
        bytes: 16,
        count: 32,
        isa: "neon",
    };

    #[test]
    fn every_candidate_fits_its_register_file() {
        for r in [AVX512, AVX2, NEON] {
            let c = DotTiling::candidates(r);
            assert!(c.len() >= 4, "{r:?}: {c:?}");
            for t in c {
                assert!(t.fits(r), "{t} on {r:?}");
            }
        }
        // AVX-512's tile is 48 accumulators on AVX2: it does not fit.
        assert!(!DotTiling::heuristic(AVX512).fits(AVX2));
        assert_eq!(DotTiling::heuristic(AVX2).to_string(), "6x16");
        assert_eq!(DotTiling::heuristic(AVX512).to_string(), "12x32");
    }

    #[test]
    fn classes_split_at_128_and_settings_read_per_class() {
        assert_eq!(DotClass::of(128, 256), DotClass::ShallowWide);
        assert_eq!(DotClass::of(256, 128), DotClass::DeepNarrow);
        assert_eq!(DotClass::of(1024, 1024), DotClass::DeepWide);
        assert_eq!(DotClass::of(64, 64), DotClass::ShallowNarrow);
        for c in DotClass::ALL {
            assert_eq!(c.name().parse::<DotClass>(), Ok(c));
        }
        let all = DotTilings::parse_setting("4x16", AVX2).unwrap();
        assert_eq!(all, DotTilings::uniform("4x16".parse().unwrap()));
        let one = DotTilings::parse_setting("deep-wide=4x16", AVX2).unwrap();
        assert_eq!(one.get(DotClass::DeepWide).to_string(), "4x16");
        assert_eq!(one.get(DotClass::ShallowWide), DotTiling::heuristic(AVX2));
        assert_eq!(
            one.to_string(),
            "shallow-narrow 6x16, shallow-wide 6x16, deep-narrow 6x16, deep-wide 4x16"
        );
        for bad in [
            "deep=4x16",
            "deep-wide=4",
            "deep-wide:4x16,x",
            "deep-wide=4x16,",
        ] {
            let e = DotTilings::parse_setting(bad, AVX2).unwrap_err();
            assert!(
                matches!(
                    e,
                    TilingError::Class { .. } | TilingError::Pair(_) | TilingError::Tile(_)
                ),
                "{bad}: {e}"
            );
            let e = e.to_string();
            assert!(
                e.contains("class") || e.contains("ROWSxLANES"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn tiles_read_back_and_bad_ones_are_named() {
        for t in DotTiling::candidates(AVX512) {
            assert_eq!(t.to_string().parse::<DotTiling>(), Ok(t));
        }
        for bad in [
            "", "6", "6x", "x16", "0x16", "6x12", "6x128", "40x16", "6 x 16",
        ] {
            let e = bad.parse::<DotTiling>().unwrap_err();
            assert_eq!(e, TilingError::Tile(bad.to_string()));
            assert!(e.to_string().contains("ROWSxLANES"), "{bad}: {e}");
        }
    }
}
