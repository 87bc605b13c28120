//! `xla.CompileOptionsProto`, serialized by hand (a few varint fields need
//! no protobuf compiler).

/// Options of a compilation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    /// Replicas (data-parallel copies on different devices).
    pub num_replicas: usize,
    /// Partitions (model-parallel shards).
    pub num_partitions: usize,
    /// Fix the device of each replica and partition at compile time (device
    /// `r · partitions + p`): what a kernel that names devices itself (a
    /// Mosaic kernel with remote copies) needs; libtpu refuses one without
    /// ("Static device assignment is undefined").
    pub static_assignment: bool,
    /// Partition with Shardy (`use_shardy_partitioner`): what a module
    /// whose shardings are Shardy's (`sdy.*`, JAX's default lowering)
    /// needs; the GSPMD partitioner refuses its `xla.sdy` custom calls.
    pub shardy: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            static_assignment: false,
            shardy: false,
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

fn message_field(field: u32, body: &[u8], out: &mut Vec<u8>) {
    varint((u64::from(field) << 3) | 2, out);
    varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

impl CompileOptions {
    /// The counts a module's header declares (`mhlo.num_replicas`,
    /// `mhlo.num_partitions` on `module @name attributes {..}`), 1 where
    /// it declares none: what a program across several devices compiles
    /// with.
    pub fn of_module(text: &str) -> CompileOptions {
        let header = text
            .lines()
            .find(|l| l.trim_start().starts_with("module"))
            .unwrap_or("");
        let count = |key: &str| -> usize {
            header
                .split(key)
                .nth(1)
                .and_then(|rest| rest.trim_start().strip_prefix('='))
                .and_then(|rest| {
                    let digits: String = rest
                        .trim_start()
                        .chars()
                        .take_while(char::is_ascii_digit)
                        .collect();
                    digits.parse().ok()
                })
                .filter(|&n| n >= 1)
                .unwrap_or(1)
        };
        let (num_replicas, num_partitions) =
            (count("mhlo.num_replicas"), count("mhlo.num_partitions"));
        CompileOptions {
            num_replicas,
            num_partitions,
            static_assignment: num_replicas * num_partitions > 1,
            shardy: text.contains("sdy.mesh") || text.contains("xla.sdy."),
        }
    }

    /// The serialized `CompileOptionsProto`: `executable_build_options`
    /// (field 3) with `device_ordinal = -1` (unset), `num_replicas` (4) and
    /// `num_partitions` (5).
    pub fn to_proto(&self) -> Vec<u8> {
        let mut build = Vec::new();
        int_field(1, -1, &mut build);
        int_field(4, self.num_replicas as i64, &mut build);
        int_field(5, self.num_partitions as i64, &mut build);
        if self.num_partitions > 1 {
            // use_spmd_partitioning: TPUs run partitions as one SPMD program.
            int_field(6, 1, &mut build);
        }
        if self.static_assignment {
            // DeviceAssignmentProto: replica_count (1), computation_count
            // (2), one ComputationDevice (3) per partition listing the
            // device of each replica (1).
            let mut assignment = Vec::new();
            int_field(1, self.num_replicas as i64, &mut assignment);
            int_field(2, self.num_partitions as i64, &mut assignment);
            for p in 0..self.num_partitions {
                let mut devices = Vec::new();
                for r in 0..self.num_replicas {
                    int_field(1, (r * self.num_partitions + p) as i64, &mut devices);
                }
                message_field(3, &devices, &mut assignment);
            }
            message_field(9, &assignment, &mut build);
        }
        if self.shardy {
            // use_shardy_partitioner (field 19).
            int_field(19, 1, &mut build);
        }
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
    fn reads_the_counts_a_module_declares() {
        let m = "module @m attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 4 : i32} {\n}";
        assert_eq!(
            CompileOptions::of_module(m),
            CompileOptions {
                num_replicas: 4,
                num_partitions: 1,
                static_assignment: true,
                shardy: false,
            }
        );
        assert_eq!(
            CompileOptions::of_module("module {\n}"),
            CompileOptions::default()
        );
    }

    #[test]
    fn a_shardy_module_compiles_with_the_shardy_partitioner() {
        let m = "module @jit_f attributes {mhlo.num_partitions = 4 : i32} {\n  sdy.mesh @mesh = <[\"x\"=4]>\n}";
        let o = CompileOptions::of_module(m);
        assert!(o.shardy && o.num_partitions == 4, "{o:?}");
        // use_shardy_partitioner = field 19, varint 1: tag bytes 0x98 0x01.
        let p = o.to_proto();
        assert!(p.windows(3).any(|w| w == [0x98, 0x01, 0x01]), "{p:?}");
        let plain = CompileOptions::of_module("module @m {\n}").to_proto();
        assert!(!plain.windows(2).any(|w| w == [0x98, 0x01]), "{plain:?}");
    }

    #[test]
    fn encodes_the_build_options_message() {
        let p = CompileOptions {
            num_replicas: 4,
            num_partitions: 1,
            static_assignment: false,
            shardy: false,
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
