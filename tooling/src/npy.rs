//! NumPy `.npy` files: what `tessera run` reads and writes.
//!
//! Supported element types: `f4` (f32), `f2` (f16), `i4` (i32), `i1`
//! (i8), `b1` (bool), little-endian or byte-order-free, C order, format
//! versions 1.0 to 3.0. NumPy has no bfloat16: a bf16 array is **written
//! as float32** (exactly: every bf16 value is an f32), and a float32 file
//! given to a bf16 operand is rounded to bf16 (to nearest, ties to even).
//! Nor has it fp8: an fp8 array is written as **uint8 bit patterns**
//! (`|u1`, what ml_dtypes' `a.view(np.uint8)` gives; read it back with
//! `np.load(f).view(ml_dtypes.float8_e4m3fn)`). A uint8 file reads as
//! `f8e4m3fn`; [`reinterpret_fp8`] turns it into the `f8e5m2` it holds
//! (every pattern survives), and a float32 file given to an fp8 operand is
//! rounded to it. (Arrays hold values, so the NaN patterns of a format
//! come back as its canonical NaN of the same sign.)
//!
//! ```
//! use kernel_ir::{Array, DType};
//! let a = Array::random(DType::F32, [2, 3], 1, -1.0, 1.0);
//! let bytes = tooling::npy::encode(&a);
//! assert_eq!(tooling::npy::decode(&bytes).unwrap(), a);
//! ```

use kernel_ir::{Array, DType};

const MAGIC: &[u8] = b"\x93NUMPY";

/// Why a file is not a usable `.npy`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NpyError(pub String);

fn err(m: impl Into<String>) -> NpyError {
    NpyError(m.into())
}

/// The `descr` NumPy writes for a dtype (bf16 is stored as f32).
fn descr(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::BF16 => "<f4",
        DType::F16 => "<f2",
        DType::I32 => "<i4",
        DType::I8 => "|i1",
        DType::Bool => "|b1",
        // NumPy has no fp8: the bit patterns, as ml_dtypes' `.view(np.uint8)`.
        DType::F8E4M3FN | DType::F8E5M2 => "|u1",
    }
}

/// A `.npy` file holding `a` (version 1.0, C order).
pub fn encode(a: &Array) -> Vec<u8> {
    let stored = if a.dtype() == DType::BF16 {
        a.cast(DType::F32)
    } else {
        a.clone()
    };
    let shape: Vec<String> = a.shape().iter().map(|d| d.to_string()).collect();
    let shape = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!("({})", shape.join(", ")),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        descr(a.dtype())
    );
    // Magic (6) + version (2) + length (2) + header, padded with spaces to a
    // multiple of 64 and ended by a newline.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + a.len() * 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&stored.to_le_bytes());
    out
}

/// The value of `key` in a NumPy header dict (`'key': value`).
fn field<'a>(header: &'a str, key: &str) -> Result<&'a str, NpyError> {
    let k = format!("'{key}':");
    let start = header
        .find(&k)
        .ok_or_else(|| err(format!("the header has no '{key}'")))?
        + k.len();
    let rest = header[start..].trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')').map(|i| i + 1)
    } else {
        rest.find([',', '}'])
    }
    .ok_or_else(|| err(format!("the header's '{key}' is cut off")))?;
    Ok(rest[..end].trim())
}

/// The most bytes of data a `.npy` file may hold here (16 GiB): a larger
/// claim is refused before anything is read.
pub const MAX_DATA_BYTES: u64 = 16 << 30;

/// What a `.npy` header says: where the data starts, its type and shape.
struct Header {
    data_start: usize,
    dtype: DType,
    shape: Vec<usize>,
    /// Bytes of data the header claims (checked against overflow and
    /// [`MAX_DATA_BYTES`]).
    data_bytes: usize,
}

/// Reads the header from the first bytes of a file (`prefix` holds at least
/// the magic, version and length fields, and the header if it fits).
fn header(prefix: &[u8]) -> Result<Header, NpyError> {
    if prefix.len() < 10 || &prefix[..6] != MAGIC {
        return Err(err("not a .npy file (no \\x93NUMPY magic)"));
    }
    let (header_start, header_len) = match prefix[6] {
        1 => (10, u16::from_le_bytes([prefix[8], prefix[9]]) as usize),
        2 | 3 if prefix.len() >= 12 => (
            12,
            u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]) as usize,
        ),
        v => return Err(err(format!("unsupported .npy format version {v}"))),
    };
    if header_len > MAX_HEADER {
        return Err(err(format!(
            "the header claims {header_len} bytes; real .npy headers are under {MAX_HEADER}"
        )));
    }
    let data_start = header_start + header_len;
    let header = prefix
        .get(header_start..data_start)
        .ok_or_else(|| err("the header is cut off"))?;
    let header = std::str::from_utf8(header).map_err(|_| err("the header is not text"))?;
    let d = field(header, "descr")?.trim_matches(|c| c == '\'' || c == '"');
    let dtype = match d {
        "<f4" | "=f4" | "f4" => DType::F32,
        "<f2" | "=f2" | "f2" => DType::F16,
        "<i4" | "=i4" | "i4" => DType::I32,
        "|i1" | "<i1" | "i1" => DType::I8,
        "|b1" | "<b1" | "b1" | "?" => DType::Bool,
        // fp8 bit patterns; see the module docs for e5m2.
        "|u1" | "<u1" | "u1" | "B" => DType::F8E4M3FN,
        other => {
            return Err(err(format!(
                "element type '{other}' is not supported; use float32, float16, int32, int8, bool, or uint8 for fp8 bit patterns (bf16 as float32)"
            )));
        }
    };
    if field(header, "fortran_order")? != "False" {
        return Err(err(
            "fortran_order=True is not supported; save a C-ordered array (np.ascontiguousarray)",
        ));
    }
    let shape_text = field(header, "shape")?;
    let inner = shape_text.trim_start_matches('(').trim_end_matches(')');
    let shape: Vec<usize> = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .map_err(|_| err(format!("bad shape {shape_text}")))
        })
        .collect::<Result<_, _>>()?;
    let data_bytes = shape
        .iter()
        .try_fold(dtype.bytes() as u64, |a, &d| a.checked_mul(d as u64))
        .filter(|&b| b <= MAX_DATA_BYTES)
        .ok_or_else(|| {
            err(format!(
                "shape {shape:?} of {dtype} is more than {} GiB of data; refusing to read it",
                MAX_DATA_BYTES >> 30
            ))
        })? as usize;
    Ok(Header {
        data_start,
        dtype,
        shape,
        data_bytes,
    })
}

/// The longest header accepted (numpy writes a few hundred bytes).
const MAX_HEADER: usize = 1 << 16;

/// Parses a `.npy` file.
pub fn decode(bytes: &[u8]) -> Result<Array, NpyError> {
    let h = header(bytes)?;
    let data = &bytes[h.data_start.min(bytes.len())..];
    if data.len() != h.data_bytes {
        return Err(err(format!(
            "the data is {} bytes but shape {:?} of {} needs {}",
            data.len(),
            h.shape,
            h.dtype,
            h.data_bytes
        )));
    }
    Array::from_le_bytes(h.dtype, h.shape, data).map_err(|e| err(e.to_string()))
}

/// Reads a `.npy` file: the header first, then exactly the data it
/// announces (checked against the file's size when the file has one), so a
/// device that never ends (`/dev/zero`) or a huge claim is an error, not
/// an unbounded read.
pub fn read(path: &std::path::Path) -> Result<Array, NpyError> {
    use std::io::Read;
    let cannot = |e: std::io::Error| err(format!("cannot read {}: {e}", path.display()));
    let at = |e: NpyError| err(format!("{}: {e}", path.display()));
    // Checked before opening: opening a FIFO blocks until someone writes.
    let meta = std::fs::metadata(path).map_err(cannot)?;
    if meta.is_dir() {
        return Err(err(format!(
            "{} is a directory, not a .npy file",
            path.display()
        )));
    }
    if !meta.is_file() {
        return Err(err(format!(
            "{} is not a .npy file: not a regular file (a pipe or a device)",
            path.display()
        )));
    }
    let mut file = std::fs::File::open(path).map_err(cannot)?;
    let mut prefix = Vec::new();
    (&mut file)
        .take((12 + MAX_HEADER) as u64)
        .read_to_end(&mut prefix)
        .map_err(cannot)?;
    let h = header(&prefix).map_err(at)?;
    let total = h.data_start as u64 + h.data_bytes as u64;
    if meta.is_file() && meta.len() != total {
        return Err(at(err(format!(
            "the file is {} bytes but its header announces {} (shape {:?} of {}); it is truncated or not one array",
            meta.len(),
            total,
            h.shape,
            h.dtype
        ))));
    }
    let mut bytes = prefix;
    let have = bytes.len() as u64;
    if have <= total {
        // The rest, and one byte more than announced, which tells a longer
        // stream from one that fits.
        file.take(total + 1 - have)
            .read_to_end(&mut bytes)
            .map_err(cannot)?;
    }
    decode(&bytes).map_err(at)
}

/// An fp8 array (as a uint8 file reads, `f8e4m3fn`) as the other fp8
/// format with the same bit patterns; any other array as it is.
pub fn reinterpret_fp8(a: Array, dtype: DType) -> Array {
    if a.dtype().is_fp8() && dtype.is_fp8() && a.dtype() != dtype {
        let shape = a.shape().to_vec();
        Array::from_le_bytes(dtype, shape, &a.to_le_bytes()).unwrap_or(a)
    } else {
        a
    }
}

/// Writes a `.npy` file atomically (see [`crate::atomic_file`]).
pub fn write(path: &std::path::Path, a: &Array) -> Result<(), NpyError> {
    crate::atomic_file::write(path, &encode(a)).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips() {
        for d in [DType::F32, DType::F16, DType::I32, DType::I8, DType::Bool] {
            let a = Array::random(d, [3, 4, 5], 7, -3.0, 3.0);
            assert_eq!(decode(&encode(&a)).unwrap(), a, "{d}");
        }
        // bf16 comes back as the same values in f32.
        let a = Array::random(DType::BF16, [7], 1, -3.0, 3.0);
        let back = decode(&encode(&a)).unwrap();
        assert_eq!(back.dtype(), DType::F32);
        assert_eq!(back.data(), a.data());
        // Headers are padded to 64 bytes.
        assert_eq!((encode(&a).len() - 7 * 4) % 64, 0);
        // fp8: uint8 bit patterns, every one of them back, in both formats.
        for d in [DType::F8E4M3FN, DType::F8E5M2] {
            let bits: Vec<u8> = (0..=255).collect();
            let a = Array::from_le_bytes(d, [256], &bits).unwrap();
            let file = encode(&a);
            assert!(String::from_utf8_lossy(&file[..64]).contains("'descr': '|u1'"));
            assert_eq!(&file[file.len() - 256..], &a.to_le_bytes()[..]);
            let back = reinterpret_fp8(decode(&file).unwrap(), d);
            assert_eq!(back.dtype(), d);
            assert_eq!(back.to_le_bytes(), a.to_le_bytes(), "{d}");
        }
    }

    #[test]
    fn bad_files_are_errors() {
        assert!(decode(b"hello").unwrap_err().0.contains("magic"));
        let a = Array::random(DType::F32, [4], 1, 0.0, 1.0);
        let mut b = encode(&a);
        b.truncate(b.len() - 2);
        assert!(decode(&b).unwrap_err().0.contains("needs 16"));
        let mut f64_file = encode(&a);
        let at = f64_file.windows(3).position(|w| w == b"<f4").unwrap();
        f64_file[at + 2] = b'8';
        assert!(
            decode(&f64_file)
                .unwrap_err()
                .0
                .contains("'<f8' is not supported")
        );
    }

    /// A FIFO or a device given as an input is refused at once (a FIFO
    /// blocked the command until someone wrote to it).
    #[test]
    fn pipes_and_devices_are_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("tessera-npy-special-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("x.npy");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let started = std::time::Instant::now();
            let e = read(&fifo).unwrap_err().0;
            assert!(e.contains("not a regular file"), "{e}");
            assert!(started.elapsed().as_secs() < 2);
        }
        let e = read(std::path::Path::new("/dev/zero")).unwrap_err().0;
        assert!(e.contains("not a regular file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
