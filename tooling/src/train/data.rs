//! The synthetic task: copying. Each sequence is `n` random tokens, a
//! separator, and the same `n` tokens again; the model reads it causally
//! and is scored on predicting the copy (the first half is random, so only
//! the copy is learnable). Drawn from a seeded [`SplitMix64`], whose state
//! and the count of sequences drawn are what a checkpoint keeps.

use graph::{Runtime, RuntimeError};
use kernel_ir::{Array, DType, SplitMix64};

use super::model::{Batch, LmConfig};

/// The separator token.
pub const SEP: usize = 0;

/// A stream of copy-task batches.
#[derive(Clone, Debug)]
pub struct CopyTask {
    rng: SplitMix64,
    /// Sequences drawn so far (the data position).
    pub position: u64,
}

impl CopyTask {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> CopyTask {
        CopyTask {
            rng: SplitMix64(seed ^ 0xC0FF_EE00_D15E_A5E5),
            position: 0,
        }
    }

    /// A stream resumed at a checkpoint's generator state and position.
    pub fn resume(rng_state: u64, position: u64) -> CopyTask {
        CopyTask {
            rng: SplitMix64(rng_state),
            position,
        }
    }

    /// The generator state (for a checkpoint).
    pub fn rng_state(&self) -> u64 {
        self.rng.0
    }

    /// The next batch's token ids: `batch` rows of `seq + 1` tokens.
    pub fn next_tokens(&mut self, c: &LmConfig) -> Vec<Vec<usize>> {
        let n = c.seq / 2;
        (0..c.batch)
            .map(|_| {
                self.position += 1;
                let half: Vec<usize> = (0..n).map(|_| 1 + self.rng.below(c.vocab - 1)).collect();
                let mut s = half.clone();
                s.push(SEP);
                s.extend(&half);
                s
            })
            .collect()
    }

    /// The next batch, uploaded: inputs are tokens `0..seq`, targets
    /// `1..=seq`; the loss counts the copied half (targets `n..2n`).
    pub fn next_batch(&mut self, rt: &Runtime, c: &LmConfig) -> Result<Batch, RuntimeError> {
        // The step's dropout key from the stream's state, so a resumed run
        // draws the same masks.
        let mut keys = SplitMix64(self.rng.0 ^ 0xD409_0F0A_7E57_1CE5);
        let key: Vec<f64> = (0..2)
            .map(|_| f64::from(keys.next_u64() as u32 as i32))
            .collect();
        let seqs = self.next_tokens(c);
        let rows = c.batch * c.seq;
        let (mut inp, mut tgt, mut mask, mut labels) = (
            vec![0.0; rows * c.vocab],
            vec![0.0; rows * c.vocab],
            vec![0.0; rows],
            vec![-100.0; rows],
        );
        let n = c.seq / 2;
        let mut counted = 0;
        for (b, s) in seqs.iter().enumerate() {
            for p in 0..c.seq {
                let r = b * c.seq + p;
                inp[r * c.vocab + s[p]] = 1.0;
                tgt[r * c.vocab + s[p + 1]] = 1.0;
                if p >= n {
                    mask[r] = 1.0;
                    labels[r] = s[p + 1] as f64;
                    counted += 1;
                }
            }
        }
        let up = |dtype: DType, shape: Vec<usize>, v: Vec<f64>| -> Result<_, RuntimeError> {
            let a =
                Array::new(dtype, shape, v).map_err(|e| RuntimeError::Internal(e.to_string()))?;
            rt.tensor(&a)
        };
        Ok(Batch {
            inputs: up(DType::F32, vec![rows, c.vocab], inp)?,
            targets: up(DType::F32, vec![rows, c.vocab], tgt)?,
            mask: up(DType::F32, vec![rows], mask)?,
            labels: up(DType::I32, vec![rows, 1], labels)?,
            dropout_key: up(DType::I32, vec![2], key)?,
            counted,
        })
    }
}
