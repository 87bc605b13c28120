//! What a kernel costs on a TPU, by the bytes its pipeline moves: every
//! operand with a block spec is fetched from HBM into VMEM when its block
//! index changes between consecutive grid steps and kept otherwise, and an
//! output block is written back when its index changes and at the end (the
//! rule of Mosaic's pipeline, as Pallas documents it). The counts come
//! from a run of the reference interpreter on the kernel's sample inputs
//! ([`kernel_ir::interpret_traced`]), so index maps that read scalar
//! prefetch (valid lengths, page tables) and steps the body skips are
//! counted as they happen; the flops are the dots it executed. A block at
//! an array's edge moves only its in-bounds part. Operands the kernel
//! copies itself (`#[any]`, manual DMA) count the bytes its copies moved.
//!
//! [`Roofline`] turns bytes and flops into a time bound per generation
//! from the published peaks ([`kernel_ir::Target::peak_flops`],
//! [`kernel_ir::Target::hbm_bandwidth`]).

use kernel_ir::{
    Array, DType, DotShape, InterpOptions, MemorySpace, MeshStep, Target, VerifiedKernel,
};

/// One operand's traffic.
#[derive(Clone, Debug, PartialEq)]
pub struct OperandTraffic {
    /// Its name.
    pub name: String,
    /// `in` (HBM → VMEM) or `out` (VMEM → HBM).
    pub direction: &'static str,
    /// Blocks moved by the pipeline (0 for an operand the kernel copies
    /// itself: its bytes are its copies').
    pub blocks: u64,
    /// Bytes moved.
    pub bytes: u64,
}

/// A kernel's traffic and flops on its inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Cost {
    /// The kernel's name.
    pub kernel: String,
    /// Per operand, in operand order.
    pub operands: Vec<OperandTraffic>,
    /// Dot flops executed.
    pub flops: u64,
    /// Grid steps.
    pub steps: u64,
    /// The element type its rooflines use (the widest-traffic input's).
    pub dtype: DType,
    /// The dots it executed, by shape, with how often each ran.
    pub dots: Vec<(DotShape, u64)>,
}

/// A time bound on one generation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Roofline {
    /// Seconds at peak flops.
    pub compute_s: f64,
    /// Seconds at full HBM bandwidth.
    pub memory_s: f64,
}

impl Roofline {
    /// The bound: the larger of the two.
    pub fn seconds(&self) -> f64 {
        self.compute_s.max(self.memory_s)
    }

    /// `compute` or `memory`.
    pub fn bound(&self) -> &'static str {
        if self.compute_s >= self.memory_s {
            "compute"
        } else {
            "memory"
        }
    }
}

impl Cost {
    /// Bytes fetched into VMEM.
    pub fn bytes_in(&self) -> u64 {
        self.bytes_moving("in")
    }

    /// Bytes written back to HBM.
    pub fn bytes_out(&self) -> u64 {
        self.bytes_moving("out")
    }

    /// The operands' bytes in one direction (`"in"` or `"out"`).
    fn bytes_moving(&self, direction: &str) -> u64 {
        self.operands
            .iter()
            .filter(|o| o.direction == direction)
            .map(|o| o.bytes)
            .sum()
    }

    /// The MXU passes (`vmatmul`s) its executed dots take on `target`
    /// ([`Target::mxu_passes`]).
    pub fn mxu_passes(&self, target: Target) -> u64 {
        self.dots
            .iter()
            .map(|(shape, n)| target.mxu_passes(shape) * n)
            .sum()
    }

    /// Flops per byte moved.
    pub fn intensity(&self) -> f64 {
        self.flops as f64 / (self.bytes_in() + self.bytes_out()).max(1) as f64
    }

    /// The roofline bound on `target`: each executed dot at the peak of
    /// its lhs's element type (an f32 accumulator moved in and out, the
    /// widest traffic of a backward, does not make its bf16 dots f32
    /// ones); without dots, the flops at the peak of `dtype`.
    pub fn roofline(&self, target: Target) -> Roofline {
        let compute_s = if self.dots.is_empty() {
            self.flops as f64 / target.peak_flops(self.dtype)
        } else {
            self.dots
                .iter()
                .map(|(d, runs)| {
                    let flops = 2.0 * (d.batch * d.m * d.k * d.n) as f64 * *runs as f64;
                    flops / target.peak_flops(d.lhs)
                })
                .sum()
        };
        Roofline {
            compute_s,
            memory_s: (self.bytes_in() + self.bytes_out()) as f64 / target.hbm_bandwidth(),
        }
    }

    /// The cost as one JSON object (for scripts: the Pallas comparison).
    pub fn to_json(&self) -> String {
        let ops: Vec<serde_json::Value> = self
            .operands
            .iter()
            .map(|o| {
                serde_json::json!({
                    "name": o.name, "direction": o.direction, "blocks": o.blocks, "bytes": o.bytes,
                })
            })
            .collect();
        serde_json::json!({
            "kernel": self.kernel,
            "flops": self.flops,
            "steps": self.steps,
            "bytes_in": self.bytes_in(),
            "bytes_out": self.bytes_out(),
            "operands": ops,
        })
        .to_string()
    }
}

/// The traffic and flops of `kernel` on `inputs` (as
/// [`kernel_ir::interpret`] takes them); the interpreter's error when it
/// does not run.
pub fn cost(
    kernel: &VerifiedKernel,
    inputs: &[Array],
) -> Result<Cost, Box<kernel_ir::KernelError>> {
    let (_, trace) =
        kernel_ir::interpret_traced(kernel, inputs, &InterpOptions::default()).map_err(Box::new)?;
    Ok(cost_of(kernel, trace))
}

/// A kernel across a mesh: device 0's HBM traffic and flops, and its run
/// cut at its remote copies ([`MeshStep`]), on `inputs[d]` for device `d`
/// ([`kernel_ir::interpret_mesh`]). The ring kernels do the same on every
/// device.
#[derive(Clone, Debug, PartialEq)]
pub struct MeshCost {
    /// Device 0's traffic between HBM and VMEM, and its flops.
    pub device: Cost,
    /// Device 0's stretches between remote copies.
    pub steps: Vec<MeshStep>,
    /// Devices in the mesh.
    pub devices: usize,
}

/// The overlap bound of a [`MeshCost`] on one generation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Overlap {
    /// Seconds the remote copies take over one ICI link at full speed.
    pub ici_s: f64,
    /// Seconds the dots take at peak.
    pub compute_s: f64,
    /// `Σ max(transfer, compute)` over the steps: the kernel hides each
    /// transfer behind the work that follows its start.
    pub overlapped_s: f64,
    /// `Σ (transfer + compute)`: nothing hidden.
    pub serial_s: f64,
}

impl MeshCost {
    /// Bytes device 0 sent over ICI.
    pub fn ici_bytes(&self) -> u64 {
        self.steps.iter().map(|s| s.ici_bytes).sum()
    }

    /// Transfer against compute, per step, on `target` (one ICI link per
    /// copy: a ring neighbour).
    pub fn overlap(&self, target: Target) -> Overlap {
        let (mut o, mut ici_s, mut compute_s) = (0.0, 0.0, 0.0);
        for s in &self.steps {
            // Copies to different neighbours share no link.
            let t = s.busiest_link_bytes as f64 / target.ici_link_bandwidth();
            let c = s.flops as f64 / target.peak_flops(self.device.dtype);
            o += f64::max(t, c);
            ici_s += t;
            compute_s += c;
        }
        Overlap {
            ici_s,
            compute_s,
            overlapped_s: o,
            serial_s: ici_s + compute_s,
        }
    }

    /// The cost as one JSON object: device 0's [`Cost::to_json`] fields
    /// plus `devices`, `ici_bytes` and the `steps`.
    pub fn to_json(&self) -> String {
        let mut v: serde_json::Value =
            serde_json::from_str(&self.device.to_json()).unwrap_or_default();
        let steps: Vec<serde_json::Value> = self
            .steps
            .iter()
            .map(|s| serde_json::json!({"ici_bytes": s.ici_bytes, "busiest_link_bytes": s.busiest_link_bytes, "flops": s.flops}))
            .collect();
        v["devices"] = self.devices.into();
        v["ici_bytes"] = self.ici_bytes().into();
        v["mesh_steps"] = steps.into();
        v.to_string()
    }

    /// A table: the steps, then the bound per generation.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} on {} devices (device 0; every device of a ring does the same):",
            self.device.kernel, self.devices
        );
        let _ = writeln!(
            s,
            "  HBM→VMEM {} B, VMEM→HBM {} B, flops {:.3e}, ICI sent {} B in {} copies",
            self.device.bytes_in(),
            self.device.bytes_out(),
            self.device.flops as f64,
            self.ici_bytes(),
            self.steps.iter().filter(|x| x.ici_bytes > 0).count()
        );
        let _ = writeln!(s, "  {:>4} {:>12} {:>12}", "step", "ICI bytes", "flops");
        for (i, st) in self.steps.iter().enumerate() {
            let _ = writeln!(
                s,
                "  {i:>4} {:>12} {:>12.3e}",
                st.ici_bytes, st.flops as f64
            );
        }
        let _ = writeln!(
            s,
            "  {:<6} {:>12} {:>12} {:>14} {:>12}",
            "target", "ICI", "compute", "overlapped", "serial"
        );
        for t in Target::ALL {
            let o = self.overlap(t);
            let _ = writeln!(
                s,
                "  {:<6} {:>9.3} µs {:>9.3} µs {:>11.3} µs {:>9.3} µs",
                t.name(),
                o.ici_s * 1e6,
                o.compute_s * 1e6,
                o.overlapped_s * 1e6,
                o.serial_s * 1e6
            );
        }
        s.push_str(
            "  a step runs from one remote copy's start to the next: its bytes travel while its dots run;\n  \
             ICI at one link's one-way peak (Target::ici_link_bandwidth), compute at peak flops.\n",
        );
        s
    }
}

/// [`MeshCost`] of `kernel` on `inputs[d]` for device `d`; the
/// interpreter's error when it does not run.
pub fn mesh_cost(
    kernel: &VerifiedKernel,
    inputs: &[Vec<Array>],
) -> Result<MeshCost, Box<kernel_ir::KernelError>> {
    let run =
        kernel_ir::interpret_mesh(kernel, inputs, &InterpOptions::default()).map_err(Box::new)?;
    let trace = run.traces.into_iter().next().unwrap_or_default();
    Ok(MeshCost {
        device: cost_of(kernel, trace),
        steps: run.steps.into_iter().next().unwrap_or_default(),
        devices: inputs.len(),
    })
}

fn cost_of(kernel: &VerifiedKernel, trace: kernel_ir::FetchTrace) -> Cost {
    let k = kernel.kernel();
    let mut operands = Vec::new();
    for (i, o) in k.operands.iter().enumerate() {
        if o.space == MemorySpace::Any {
            // Copied by the kernel itself: the bytes its copies moved.
            let (from, to) = trace.dma_bytes.get(i).copied().unwrap_or((0, 0));
            for (direction, bytes) in [("in", from), ("out", to)] {
                if bytes > 0 || (direction == "in" && o.role.is_input()) {
                    operands.push(OperandTraffic {
                        name: o.name.clone(),
                        direction,
                        blocks: 0,
                        bytes,
                    });
                }
            }
            continue;
        }
        let mut add = |direction, list: &[kernel_ir::BlockFetch]| {
            let mine: Vec<_> = list.iter().filter(|f| f.operand == o.name).collect();
            let bytes = mine.iter().map(|f| o.block_bytes(&f.block)).sum();
            operands.push(OperandTraffic {
                name: o.name.clone(),
                direction,
                blocks: mine.len() as u64,
                bytes,
            });
        };
        if o.role.is_input() {
            add("in", &trace.fetches);
        }
        if o.role.is_output() {
            add("out", &trace.writebacks);
        }
    }
    let dtype = k
        .operands
        .iter()
        .zip(&operands)
        .filter(|(o, _)| o.role.is_input())
        .max_by_key(|(_, t)| t.bytes)
        .map(|(o, _)| o.dtype)
        .unwrap_or(DType::F32);
    Cost {
        kernel: k.name.clone(),
        operands,
        flops: trace.flops,
        steps: k.grid.points().count() as u64,
        dtype,
        dots: trace.dots,
    }
}

/// A table of costs with a roofline column per generation.
pub fn table(rows: &[(String, Cost)]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = write!(
        s,
        "{:<40} {:>11} {:>11} {:>12} {:>8}",
        "kernel", "HBM→VMEM", "VMEM→HBM", "flops", "flop/B"
    );
    for t in Target::ALL {
        let _ = write!(s, " {:>14}", format!("{} bound", t.name()));
    }
    s.push('\n');
    let human = |b: u64| -> String {
        let b = b as f64;
        if b >= 1e9 {
            format!("{:.2} GB", b / 1e9)
        } else if b >= 1e6 {
            format!("{:.2} MB", b / 1e6)
        } else {
            format!("{:.1} kB", b / 1e3)
        }
    };
    for (name, c) in rows {
        let _ = write!(
            s,
            "{:<40} {:>11} {:>11} {:>12.3e} {:>8.1}",
            name,
            human(c.bytes_in()),
            human(c.bytes_out()),
            c.flops as f64,
            c.intensity()
        );
        for t in Target::ALL {
            let r = c.roofline(t);
            let _ = write!(
                s,
                " {:>14}",
                format!(
                    "{:.2} µs {}",
                    r.seconds() * 1e6,
                    if r.bound() == "memory" { "M" } else { "C" }
                )
            );
        }
        s.push('\n');
    }
    s.push_str(
        "\nbound: the roofline time at published peak flops (C) or HBM bandwidth (M), whichever is larger; \
         per device (a v7x chip is two). Traffic by the pipeline rule: a block moves when its index changes between steps.\n",
    );
    s
}

/// Warnings for blocks that fill a small part of the TPU's 128 lanes: a
/// VMEM operand whose physical minor block dim is under 32 (a router's
/// `[tokens, 8]` logits). The tiling rules accept such a block (it is the
/// whole dim), but each vreg then holds `dim/128` useful lanes, so its
/// copies and vector work run at that fraction of the dense rate (106× a
/// router's roofline on v6e against 14.7× transposed, measured with
/// `tessera estimate`). Operands under an eighth of the largest block's
/// bytes (per-row scales) are left out. One line per operand, naming the
/// layout that fills the lanes.
pub fn lane_sparse(kernel: &VerifiedKernel) -> Vec<String> {
    const SPARSE: usize = 32;
    let lanes = 128;
    // Small side operands (a per-row scale) move too little to matter.
    let bytes = |o: &kernel_ir::Operand| o.block.shape.iter().product::<usize>() * o.dtype.bytes();
    let largest = kernel.operands.iter().map(bytes).max().unwrap_or(0);
    kernel
        .operands
        .iter()
        .filter(|o| o.space == kernel_ir::MemorySpace::Vmem && o.shape.len() >= 2)
        .filter_map(|o| {
            let rank = o.shape.len();
            let minor = *o.layout.minor_to_major_dims(rank)?.first()?;
            let width = o.block.shape[minor];
            let longest = (0..rank)
                .filter(|&d| d != minor)
                .max_by_key(|&d| o.block.shape[d])?;
            let matters = bytes(o) * 8 >= largest;
            (width < SPARSE && o.block.shape[longest] >= lanes && matters).then(|| {
                format!(
                    "warning: `{}`: operand `{}` has {:?} blocks, {width} of {lanes} lanes used per vreg ({:.0}%): its copies and vector work run at about that fraction of the dense rate; with dim {longest} ({}) minor (the transposed layout, or `col_major`) the lanes fill",
                    kernel.name,
                    o.name,
                    o.block.shape,
                    100.0 * width as f64 / lanes as f64,
                    o.block.shape[longest],
                )
            })
        })
        .collect()
}
