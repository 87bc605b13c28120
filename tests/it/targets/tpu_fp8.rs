//! fp8 and int8 with libtpu: loads, conversions and dots of each type
//! compile on all four generations (the measurement behind the
//! `dot-operands` rule, which therefore has no per-generation part).

use kernel_ir::Target;
use kernel_ir::prelude::*;
use libtpu::TpuCompiler;

#[test]
fn fp8_and_int8_dots_and_conversions_compile_on_every_generation() {
    let tpu =
        TpuCompiler::load().unwrap_or_else(|e| panic!("the TPU compile check needs libtpu: {e}"));
    for (d, acc) in [(F8E4M3FN, F32), (F8E5M2, F32), (I8, I32)] {
        let mut k = KernelBuilder::new("mm");
        k.grid([1], [Parallel]);
        let a = k.input("a", d, [128, 128]);
        let b = k.input("b", d, [128, 128]);
        let o = k.output("o", acc, [128, 128]);
        let c = k.output("c", F32, [128, 128]);
        o.store(
            ..,
            dot_general(a.load(..), b.load(..), DotDims::matmul(), acc),
        );
        c.store(.., a.load(..).convert(F32));
        let kernel = k.build().unwrap_or_else(|e| panic!("{d}: {e}"));
        let call = lowering::tpu_custom_call(&kernel).unwrap();
        for t in Target::ALL {
            if let Err(e) = tpu.compile(t, &call.module) {
                panic!("{d} on {t}: {e}");
            }
        }
    }
}
