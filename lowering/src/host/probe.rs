//! The tuning's probe kernels: one dot per [`DotClass`] at the shapes and
//! strides the library runs, compiled with a given tile and timed.

use std::time::{Duration, Instant};

use kernel_ir::{Array, DType};

use crate::LoweringError;
use crate::host::HostKernel;
use crate::host::tiling::{DotClass, DotTiling, DotTilings};

/// One measured tile on one class's probe: its fastest run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Trial {
    /// The class whose probe ran.
    pub class: DotClass,
    /// The tile.
    pub tiling: DotTiling,
    /// Seconds.
    pub seconds: f64,
}

/// Each tile's fastest run on `class`'s probe over `rounds` interleaved
/// rounds ([`crate::HostTuning::measure`]).
pub(crate) fn measure(class: DotClass, tiles: &[DotTiling], rounds: usize) -> Vec<Trial> {
    let mut sets: Vec<(DotTiling, Probe)> = tiles
        .iter()
        .filter_map(|&t| {
            let mut probe = Probe::new(&probe_text(class), t).ok()?;
            // One untimed run: page faults, first touch.
            probe.time().ok()?;
            probe.fastest = Duration::MAX;
            Some((t, probe))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_millis(1000);
    for round in 0..rounds {
        if round >= 4 && Instant::now() > deadline {
            break;
        }
        let n = sets.len();
        for i in 0..n {
            // A run that fails here ran before; it cannot fail now but
            // for memory, and then it simply scores worse.
            let _ = sets[(i + round) % n].1.time();
        }
    }
    sets.into_iter()
        .map(|(tiling, p)| Trial {
            class,
            tiling,
            seconds: p.fastest.as_secs_f64(),
        })
        .collect()
}

/// Each class's probe: one dot of that class at the shapes and layouts
/// the library's kernels run it (the JIT's time goes to them), with its
/// packing. Real strides matter: a matmul block's lhs rows are a 1024-wide
/// matrix's rows apart (4 KiB, one L1 set), which a 256-wide probe missed.
fn probe_text(class: DotClass) -> String {
    match class {
        // Attention's scores at blocks of 128 and 256, head dim 128: q·kᵀ,
        // the rhs packed through transposes.
        DotClass::ShallowNarrow => scores_probe(128),
        DotClass::ShallowWide => scores_probe(256),
        // Attention's p·v at blocks of 256: a computed [256, 256] lhs.
        DotClass::DeepNarrow => {
            "kernel @probe_deep_narrow {
  target v5e, vmem_limit default
  grid [1 parallel]
  in @s: f32[256, 256] vmem block [256, 256] at (g0, 0) row_major
  in @v: f32[1024, 128] vmem block [256, 128] at (g0, 0) row_major
  out @o: f32[256, 128] vmem block [256, 128] at (g0, 0) row_major
body:
  %0 = load @s[0:256, 0:256] : f32[256, 256]
  %1 = neg %0 : f32[256, 256]
  %2 = load @v[0:256, 0:128] : f32[256, 128]
  %3 = dot_general %1, %2, batch []x[], contract [1]x[0] : f32[256, 256], f32[256, 128] -> f32[256, 128]
  store @o[0:256, 0:128], %3 : f32[256, 128]
}"
            .to_string()
        }
        // A 1024-deep matmul in 256³ blocks, as `matmul` runs it: four k
        // steps accumulating into the output block.
        DotClass::DeepWide => {
            "kernel @probe_deep_wide {
  target v5e, vmem_limit default
  grid [4 arbitrary]
  in @x: f32[256, 1024] vmem block [256, 256] at (0, g0) row_major
  in @y: f32[1024, 256] vmem block [256, 256] at (g0, 0) row_major
  out @o: f32[256, 256] vmem block [256, 256] at (0, 0) row_major
body:
  %0 = load @x[0:256, 0:256] : f32[256, 256]
  %1 = load @y[0:256, 0:256] : f32[256, 256]
  %2 = dot_general %0, %1, batch []x[], contract [1]x[0] : f32[256, 256], f32[256, 256] -> f32[256, 256]
  %3 = load @o[0:256, 0:256] : f32[256, 256]
  %4 = add %3, %2 : f32[256, 256]
  store @o[0:256, 0:256], %4 : f32[256, 256]
}"
            .to_string()
        }
    }
}

/// Attention's scores `q·kᵀ` over blocks of `b` rows of a 1024-row,
/// 128-wide q and k (rows 512 B apart, as the library's arrays have them).
fn scores_probe(b: usize) -> String {
    format!(
        "kernel @probe_scores_{b} {{
  target v5e, vmem_limit default
  grid [1 parallel]
  in @q: f32[1024, 128] vmem block [{b}, 128] at (g0, 0) row_major
  in @k: f32[1024, 128] vmem block [{b}, 128] at (g0, 0) row_major
  out @o: f32[{b}, {b}] vmem block [{b}, {b}] at (g0, 0) row_major
body:
  %0 = load @q[0:{b}, 0:128] : f32[{b}, 128]
  %1 = load @k[0:{b}, 0:128] : f32[{b}, 128]
  %2 = transpose %1, perm [1, 0] : f32[{b}, 128] -> f32[128, {b}]
  %3 = dot_general %0, %2, batch []x[], contract [1]x[0] : f32[{b}, 128], f32[128, {b}] -> f32[{b}, {b}]
  store @o[0:{b}, 0:{b}], %3 : f32[{b}, {b}]
}}"
    )
}

/// A probe kernel compiled with one tile, its inputs and output buffer.
struct Probe {
    kernel: HostKernel,
    inputs: Vec<Vec<u8>>,
    output: Vec<u8>,
    fastest: Duration,
}

impl Probe {
    fn new(text: &str, tiling: DotTiling) -> Result<Probe, LoweringError> {
        let kernel = kernel_ir::parse(text)
            .map_err(|e| LoweringError::Internal(format!("probe kernel: {e:?}")))?
            .verify()
            .map_err(|e| LoweringError::Internal(format!("probe kernel: {e}")))?;
        let kernel = HostKernel::compile_tiled(&kernel, DotTilings::uniform(tiling))?
            .with_options(crate::HostOptions { threads: 1 });
        let k = kernel.kernel();
        let inputs = k
            .inputs()
            .enumerate()
            .map(|(i, o)| Array::random(DType::F32, o.shape.clone(), i as u64, -1.0, 1.0))
            .map(|a| a.to_le_bytes())
            .collect();
        let output = vec![
            0u8;
            k.outputs()
                .map(|o| o.shape.iter().product::<usize>() * 4)
                .sum()
        ];
        Ok(Probe {
            kernel,
            inputs,
            output,
            fastest: Duration::MAX,
        })
    }

    fn time(&mut self) -> Result<(), LoweringError> {
        let inputs: Vec<&[u8]> = self.inputs.iter().map(Vec::as_slice).collect();
        let start = Instant::now();
        self.kernel
            .run_bytes(&[], &inputs, &mut [self.output.as_mut_slice()])?;
        self.fastest = self.fastest.min(start.elapsed());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::cpu::CpuIdentity;

    /// Each class's probe holds one dot of that class, and every candidate
    /// tile compiles and runs it.
    #[test]
    fn every_probe_is_one_dot_of_its_class() {
        let r = CpuIdentity::host().registers;
        for class in DotClass::ALL {
            let k = kernel_ir::parse(&probe_text(class))
                .unwrap()
                .verify()
                .unwrap();
            let mut dots = Vec::new();
            k.body.walk(&mut |op| {
                if let kernel_ir::OpKind::Dot { lhs, rhs, dims, .. } = &op.kind {
                    let (lt, rt) = (&k.body.values[lhs.index()], &k.body.values[rhs.index()]);
                    let [_, _, kk, n] = dims.sizes(&lt.shape, &rt.shape);
                    dots.push((kk, n));
                }
            });
            assert_eq!(dots.len(), 1, "{class}");
            assert_eq!(DotClass::of(dots[0].0, dots[0].1), class);
            let m = measure(class, &DotTiling::candidates(r), 1);
            assert_eq!(m.len(), DotTiling::candidates(r).len(), "{class}: {m:?}");
            assert!(
                m.iter().all(|t| t.seconds > 0.0 && t.seconds < 1.0),
                "{m:?}"
            );
        }
    }
}
