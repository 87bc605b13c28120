//! The unfused XLA baselines, written with the graph runtime's ops and
//! exported as the StableHLO module XLA compiles.

use graph::{Runtime, RuntimeError, Tensor};
use kernel_ir::{Array, DType, DotDims};

use super::*;

/// `[.., S, D] × [.., S, D]` products over the `[1, H]` batch dims,
/// contracting dim `l` of the lhs with dim `r` of the rhs.
fn batched(l: usize, r: usize) -> DotDims {
    DotDims {
        lhs_batch: vec![0, 1],
        rhs_batch: vec![0, 1],
        lhs_contract: vec![l],
        rhs_contract: vec![r],
    }
}

/// `P = softmax(Q·Kᵀ·scale [+ causal mask])` over `[1, H, S, S]`, op by
/// op: the `[S, S]` intermediate flash attention never writes.
fn probabilities(
    rt: &Runtime,
    q: &Tensor,
    k: &Tensor,
    s: usize,
    causal: bool,
) -> Result<Tensor, RuntimeError> {
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    let scores = q.dot_general(k, batched(3, 3))?.scale(scale)?;
    let scores = if causal {
        let shape = [1, HEADS, s, s];
        let keep = rt
            .iota(&shape, 2, DType::I32)?
            .ge(&rt.iota(&shape, 3, DType::I32)?)?;
        let hidden = rt
            .scalar(f64::NEG_INFINITY, DType::F32)
            .broadcast_to(&shape)?;
        keep.select(&scores, &hidden)?
    } else {
        scores
    };
    scores.softmax(3)
}

/// The baseline graph of `w` on a CPU runtime, exported.
pub(super) fn baseline(w: Workload) -> Result<String, RuntimeError> {
    let rt = Runtime::cpu()?;
    let input = |shape: &[usize]| rt.tensor(&Array::zeros(DType::F32, shape.to_vec()));
    match w {
        Workload::Matmul { n } => {
            let (a, b) = (input(&[n, n])?, input(&[n, n])?);
            let c = a.matmul(&b)?;
            rt.export(&[&a, &b], &[&c])
        }
        Workload::Attention { s, causal } => {
            let shape = [1, HEADS, s, HEAD_DIM];
            let (q, k, v) = (input(&shape)?, input(&shape)?, input(&shape)?);
            let o = probabilities(&rt, &q, &k, s, causal)?.dot_general(&v, batched(3, 2))?;
            rt.export(&[&q, &k, &v], &[&o])
        }
        Workload::AttentionBwd { s, causal } => {
            // P recomputed from q, k; then dV = Pᵀ·dO, dP = dO·Vᵀ,
            // dS = P ∘ (dP − rowsum(P ∘ dP)), dQ = scale·dS·K,
            // dK = scale·dSᵀ·Q, each with an [S, S] intermediate.
            let shape = [1, HEADS, s, HEAD_DIM];
            let (q, k, v, d_o) = (
                input(&shape)?,
                input(&shape)?,
                input(&shape)?,
                input(&shape)?,
            );
            let p = probabilities(&rt, &q, &k, s, causal)?;
            let dv = p.dot_general(&d_o, batched(2, 2))?;
            let dp = d_o.dot_general(&v, batched(3, 3))?;
            let delta = p
                .mul(&dp)?
                .sum(&[3])?
                .broadcast_in_dim(&[1, HEADS, s, s], &[0, 1, 2])?;
            let ds = p
                .mul(&dp.sub(&delta)?)?
                .scale(1.0 / (HEAD_DIM as f64).sqrt())?;
            let dq = ds.dot_general(&k, batched(3, 2))?;
            let dk = ds.dot_general(&q, batched(2, 2))?;
            rt.export(&[&q, &k, &v, &d_o], &[&dq, &dk, &dv])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::check::{ErrorStats, Tolerance};
    use kernels::reference;
    use runtime::backend::{Backend, Prepared, cpu_client};
    use runtime::pjrt::CompileOptions;

    /// Runs the exported baseline of `w` on XLA's CPU plugin.
    fn run_baseline(w: Workload, args: &[Array]) -> Vec<Array> {
        let client = cpu_client().unwrap();
        let executable = client
            .compile(
                w.baseline_module().unwrap().as_bytes(),
                &CompileOptions::default(),
            )
            .unwrap();
        Prepared::Pjrt {
            backend: Backend::Decomposed,
            executable,
            client,
            kernel: None,
        }
        .run(args)
        .unwrap()
    }

    /// The peer the benchmark compares with computes what it claims:
    /// attention forward and backward against the f64 reference.
    #[test]
    fn the_xla_baselines_compute_attention() {
        let s = 64;
        let shape = [1, HEADS, s, HEAD_DIM];
        let r = |seed| Array::random(DType::F32, shape, seed, -1.0, 1.0);
        let (q, k, v, g) = (r(1), r(2), r(3), r(4));
        let scale = 1.0 / (HEAD_DIM as f64).sqrt();
        for causal in [false, true] {
            let o = run_baseline(
                Workload::Attention { s, causal },
                &[q.clone(), k.clone(), v.clone()],
            );
            let want = reference::attention(&q, &k, &v, causal, scale);
            let st = ErrorStats::between(&o[0], &want, Tolerance::attention(DType::F32));
            assert!(st.passes(), "forward causal={causal}: {st}");
            let grads = run_baseline(
                Workload::AttentionBwd { s, causal },
                &[q.clone(), k.clone(), v.clone(), g.clone()],
            );
            let spec = reference::AttnSpec::new(causal, scale);
            let (dq, dk, dv) = reference::attention_backward(&q, &k, &v, &g, &spec);
            for (name, got, want) in [
                ("dq", &grads[0], dq),
                ("dk", &grads[1], dk),
                ("dv", &grads[2], dv),
            ] {
                let st = ErrorStats::between(got, &want, Tolerance::attention_grad(DType::F32));
                assert!(st.passes(), "{name} causal={causal}: {st}");
            }
        }
        let (a, b) = (
            Array::random(DType::F32, [64, 64], 5, -1.0, 1.0),
            Array::random(DType::F32, [64, 64], 6, -1.0, 1.0),
        );
        let c = run_baseline(Workload::Matmul { n: 64 }, &[a.clone(), b.clone()]);
        let st = ErrorStats::between(
            &c[0],
            &reference::matmul(&a, &b),
            Tolerance::matmul(64, DType::F32),
        );
        assert!(st.passes(), "matmul: {st}");
    }
}
