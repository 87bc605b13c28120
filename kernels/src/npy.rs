//! NumPy `.npy` files: what `tessera run` reads and writes.
//!
//! Supported element types: `f4` (f32), `f2` (f16), `i4` (i32), `i1`
//! (i8), `b1` (bool), little-endian or byte-order-free, C order, format
//! versions 1.0 to 3.0. NumPy has no bfloat16: a bf16 array is **written
//! as float32** (exactly: every bf16 value is an f32), and a float32 file
//! given to a bf16 operand is rounded to bf16 (to nearest, ties to even).
//!
//! ```
//! use kernel_ir::{Array, DType};
//! let a = Array::random(DType::F32, [2, 3], 1, -1.0, 1.0);
//! let bytes = kernels::npy::encode(&a);
//! assert_eq!(kernels::npy::decode(&bytes).unwrap(), a);
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

/// Parses a `.npy` file.
pub fn decode(bytes: &[u8]) -> Result<Array, NpyError> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(err("not a .npy file (no \\x93NUMPY magic)"));
    }
    let (header_start, header_len) = match bytes[6] {
        1 => (10, u16::from_le_bytes([bytes[8], bytes[9]]) as usize),
        2 | 3 if bytes.len() >= 12 => (
            12,
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
        ),
        v => return Err(err(format!("unsupported .npy format version {v}"))),
    };
    let data_start = header_start + header_len;
    let header = bytes
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
        other => {
            return Err(err(format!(
                "element type '{other}' is not supported; use float32, float16, int32, int8 or bool (bf16 as float32)"
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
    let data = &bytes[data_start..];
    let want = shape.iter().product::<usize>() * dtype.bytes();
    if data.len() != want {
        return Err(err(format!(
            "the data is {} bytes but shape {shape:?} of {dtype} needs {want}",
            data.len()
        )));
    }
    Array::from_le_bytes(dtype, shape, data).map_err(|e| err(e.to_string()))
}

/// Reads a `.npy` file.
pub fn read(path: &std::path::Path) -> Result<Array, NpyError> {
    let bytes =
        std::fs::read(path).map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
    decode(&bytes).map_err(|e| err(format!("{}: {e}", path.display())))
}

/// Writes a `.npy` file.
pub fn write(path: &std::path::Path, a: &Array) -> Result<(), NpyError> {
    std::fs::write(path, encode(a))
        .map_err(|e| err(format!("cannot write {}: {e}", path.display())))
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
}
