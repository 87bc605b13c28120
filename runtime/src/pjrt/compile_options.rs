//! `xla.CompileOptionsProto`, serialized by hand (a few varint fields need
//! no protobuf compiler).

/// Options of a compilation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    /// Replicas (data-parallel copies on different devices).
    pub num_replicas: usize,
    /// Partitions (model-parallel shards).
    pub num_partitions: usize,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
        }
    }
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn int_field(field: u32, v: i64, out: &mut Vec<u8>) {
    varint(u64::from(field) << 3, out);
    varint(v as u64, out);
}

impl CompileOptions {
    /// The serialized `CompileOptionsProto`: `executable_build_options`
    /// (field 3) with `device_ordinal = -1` (unset), `num_replicas` (4) and
    /// `num_partitions` (5).
    pub fn to_proto(&self) -> Vec<u8> {
        let mut build = Vec::new();
        int_field(1, -1, &mut build);
        int_field(4, self.num_replicas as i64, &mut build);
        int_field(5, self.num_partitions as i64, &mut build);
        let mut out = Vec::new();
        varint((3 << 3) | 2, &mut out);
        varint(build.len() as u64, &mut out);
        out.extend(build);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_build_options_message() {
        let p = CompileOptions {
            num_replicas: 4,
            num_partitions: 1,
        }
        .to_proto();
        // field 3, wire type 2, then the message: field 1 = -1 (ten-byte
        // varint), field 4 = 4, field 5 = 1.
        let mut want = vec![0x1a, 15, 0x08];
        want.extend([0xff; 9]);
        want.push(0x01);
        want.extend([0x20, 4, 0x28, 1]);
        assert_eq!(p, want);
    }
}
