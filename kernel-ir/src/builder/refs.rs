//! Buffer handles: operand windows, scratch and scalar prefetch.

use super::index::{Idx, IntoIndices, Start};
use super::state::{self, State};
use super::tile::{IntoOperand, Tile};
use crate::error::ErrorKind;
use crate::{
    BlockSpec, BufferRef, DType, Index, IndexExpr, IndexMap, IndexValue, Layout, Loc, MemorySpace,
    OpKind, Order, TileType,
};

/// A buffer of the kernel being built: an operand's window (the whole array
/// for `any`), a scratch buffer or a scalar-prefetch operand. `Copy`.
#[derive(Clone, Copy, Debug)]
pub struct Ref {
    buffer: BufferRef,
    builder: u32,
}

/// A block shape and its index map (from the grid indices to block
/// indices), as a value: what a function shared by several operands or
/// kernels returns, and `#[block(spec(..))]` takes.
///
/// ```
/// use kernel_ir::prelude::*;
/// use kernel_ir::{BlockMap, IndexExpr};
///
/// /// Row block `i` of a `[rows, cols]` array.
/// fn rows(bm: usize, cols: usize) -> BlockMap<impl FnOnce([IndexExpr; 1]) -> (IndexExpr, i64)> {
///     BlockMap::new([bm, cols], |[i]: [IndexExpr; 1]| (i, 0))
/// }
///
/// #[tpu_kernel(grid = (2,), semantics = (parallel,))]
/// fn copy(
///     #[shape(16, 128)] #[block(rows(8, 128))] x: In<f32>,
///     #[shape(16, 128)] #[block(rows(8, 128))] o: Out<f32>,
/// ) {
///     o.store(.., x.load(..));
/// }
///
/// fn main() {
///     assert!(copy::build(copy::Dims {}).is_ok());
/// }
/// ```
pub struct BlockMap<F> {
    /// The block shape.
    pub shape: Vec<usize>,
    /// The index map.
    pub map: F,
}

impl<F> BlockMap<F> {
    /// A block of `shape` placed by `map`.
    pub fn new(shape: impl Into<Vec<usize>>, map: F) -> BlockMap<F> {
        BlockMap {
            shape: shape.into(),
            map,
        }
    }
}

/// Converts what an index-map closure returns into block-index expressions.
pub trait IntoIndexExprs {
    /// One expression per block dim.
    fn into_exprs(self) -> Vec<IndexExpr>;
}

impl IntoIndexExprs for IndexExpr {
    fn into_exprs(self) -> Vec<IndexExpr> {
        vec![self]
    }
}
macro_rules! int_exprs {
    ($($t:ty),*) => {$(
        impl IntoIndexExprs for $t {
            fn into_exprs(self) -> Vec<IndexExpr> {
                vec![self.into()]
            }
        }
    )*};
}
int_exprs!(i32, i64, usize);

impl IntoIndexExprs for Vec<IndexExpr> {
    fn into_exprs(self) -> Vec<IndexExpr> {
        self
    }
}
impl<T: Into<IndexExpr>, const N: usize> IntoIndexExprs for [T; N] {
    fn into_exprs(self) -> Vec<IndexExpr> {
        self.into_iter().map(Into::into).collect()
    }
}
macro_rules! tuple_exprs {
    ($($name:ident),+) => {
        impl<$($name: Into<IndexExpr>),+> IntoIndexExprs for ($($name,)+) {
            #[allow(non_snake_case)]
            fn into_exprs(self) -> Vec<IndexExpr> {
                let ($($name,)+) = self;
                vec![$($name.into()),+]
            }
        }
    };
}
tuple_exprs!(A);
tuple_exprs!(A, B);
tuple_exprs!(A, B, C);
tuple_exprs!(A, B, C, D);
tuple_exprs!(A, B, C, D, E);
tuple_exprs!(A, B, C, D, E, F);

impl Ref {
    pub(super) fn new(buffer: BufferRef, builder: u32) -> Ref {
        Ref { buffer, builder }
    }

    /// Which buffer this is.
    pub fn buffer(self) -> BufferRef {
        self.buffer
    }

    /// The builder this buffer belongs to.
    pub(super) fn builder_id(self) -> u32 {
        self.builder
    }

    /// The shape the body sees (block, whole array for `any`, or the
    /// buffer's shape).
    pub fn shape(self) -> Vec<usize> {
        state::with(self.builder, |st| {
            st.sig
                .buffer(self.buffer)
                .map(|(_, _, s)| s.to_vec())
                .unwrap_or_default()
        })
        .unwrap_or_default()
    }

    /// Element type.
    pub fn dtype(self) -> DType {
        state::with(self.builder, |st| st.sig.buffer(self.buffer).map(|b| b.1))
            .flatten()
            .unwrap_or(DType::F32)
    }

    /// Changes a declaration of an operand; other buffers get an error.
    fn edit_operand(
        self,
        what: &'static str,
        loc: Loc,
        f: impl FnOnce(&mut crate::Operand),
    ) -> Ref {
        state::with(self.builder, |st| match self.buffer {
            BufferRef::Operand(i) if i < st.sig.operands.len() => f(&mut st.sig.operands[i]),
            _ => st.error(
                ErrorKind::Builder(crate::BuilderMisuse::NotAnOperand(what)),
                Some(loc),
            ),
        });
        self
    }

    /// Sets the block shape and index map. The map receives one
    /// [`IndexExpr`] per grid dim and returns one block index per array dim:
    /// `.block([bm, bk], |[i, _, k]| (i, k))`.
    #[track_caller]
    pub fn block<const G: usize, R: IntoIndexExprs>(
        self,
        shape: impl Into<Vec<usize>>,
        map: impl FnOnce([IndexExpr; G]) -> R,
    ) -> Ref {
        let loc = Loc::caller();
        let exprs = map(std::array::from_fn(IndexExpr::Grid)).into_exprs();
        let shape = shape.into();
        let rank = state::with(self.builder, |st| st.sig.grid.rank()).unwrap_or(G);
        if rank != G {
            state::with(self.builder, |st| {
                st.error(
                    ErrorKind::Builder(crate::BuilderMisuse::IndexMapArity {
                        takes: G,
                        grid_rank: rank,
                    }),
                    Some(loc.clone()),
                )
            });
        }
        self.edit_operand("a block spec", loc, |o| {
            o.block = BlockSpec {
                shape,
                index_map: IndexMap::new(exprs),
                buffers: o.block.buffers,
                element: o.block.element.take(),
            }
        })
    }

    /// Sets the block shape and index map from expressions over the grid
    /// indices ([`IndexExpr::Grid`]`(d)` is grid index `d`): the form for
    /// kernels whose grid rank is only known at run time; [`Ref::block`] is
    /// the usual one. The verifier checks the map against the grid.
    #[track_caller]
    pub fn block_exprs(self, shape: impl Into<Vec<usize>>, map: Vec<IndexExpr>) -> Ref {
        let loc = Loc::caller();
        let shape = shape.into();
        self.edit_operand("a block spec", loc, |o| {
            o.block = BlockSpec {
                shape,
                index_map: IndexMap::new(map),
                buffers: o.block.buffers,
                element: o.block.element.take(),
            }
        })
    }

    /// [`Ref::block`] from a [`BlockMap`]: the form `#[block(spec(..))]`
    /// expands to, so kernels can share one block spec written as a
    /// function.
    #[track_caller]
    pub fn block_of<const G: usize, R: IntoIndexExprs>(
        self,
        spec: BlockMap<impl FnOnce([IndexExpr; G]) -> R>,
    ) -> Ref {
        self.block(spec.shape, spec.map)
    }

    /// Makes the index map give element offsets, not block indices
    /// (Pallas's `pl.Element` block dims): each window starts at the
    /// element the map returns, in the array padded by `low[d]` elements
    /// before dim `d` and `high[d]` after it, so windows may overlap. A
    /// stencil or causal conv reads its halo this way, pipelined like any
    /// block: rows `t·bt − h .. t·bt + bt` are
    /// `.block([bt + h, c], |[t]| (t * bt, 0)).element_window([h, 0], [0, 0])`.
    /// Inputs only; each window must lie inside the padded array, and
    /// what it sees of the padding is undefined (mask it).
    ///
    /// ```
    /// use kernel_ir::prelude::*;
    ///
    /// // Each row plus the row before it (0 before the first).
    /// let mut k = KernelBuilder::new("pairs");
    /// k.grid([2], [Parallel]);
    /// let x = k
    ///     .input("x", F32, [16, 128])
    ///     .block([16, 128], |[t]| (t * 8, 0))
    ///     .element_window([8, 0], [0, 0]);
    /// let o = k.output("o", F32, [16, 128]).block([8, 128], |[t]| (t, 0));
    /// let row = iota(I32, [8, 128], 0) + program_id(0) * 8;
    /// let before = select(row.ge(1), x.load((7..15, ..)), 0.0);
    /// o.store(.., x.load((8..16, ..)) + before);
    /// let kernel = k.build().unwrap();
    /// let data: Vec<f64> = (0..16 * 128).map(|i| (i / 128) as f64).collect();
    /// let out = interpret(&kernel, &[Array::new(F32, [16, 128], data).unwrap()]).unwrap();
    /// assert_eq!(out[0].data()[0], 0.0);
    /// assert_eq!(out[0].data()[9 * 128], 9.0 + 8.0);
    /// ```
    #[track_caller]
    pub fn element_window(self, low: impl Into<Vec<usize>>, high: impl Into<Vec<usize>>) -> Ref {
        let pad = crate::ElementPad {
            low: low.into(),
            high: high.into(),
        };
        self.edit_operand("an element window", Loc::caller(), |o| {
            o.block.element = Some(pad)
        })
    }

    /// Pipeline buffers of the operand's window (Pallas's `Buffered(n)`):
    /// 1 or 2; see [`crate::BlockSpec::buffers`].
    #[track_caller]
    pub fn buffered(self, n: usize) -> Ref {
        self.edit_operand("a buffering depth", Loc::caller(), |o| {
            o.block.buffers = Some(n)
        })
    }

    /// Sets the layout hints.
    #[track_caller]
    pub fn layout(self, layout: Layout) -> Ref {
        self.edit_operand("a layout", Loc::caller(), |o| o.layout = layout)
    }

    /// Physical order: trailing matrices column-major (see [`Order::ColMajor`]).
    #[track_caller]
    pub fn col_major(self) -> Ref {
        self.edit_operand("a layout", Loc::caller(), |o| {
            o.layout.order = Order::ColMajor
        })
    }

    /// Physical order: row-major (the default).
    #[track_caller]
    pub fn row_major(self) -> Ref {
        self.edit_operand("a layout", Loc::caller(), |o| {
            o.layout.order = Order::RowMajor
        })
    }

    /// Requires every block start to be aligned to `bytes`.
    #[track_caller]
    pub fn align(self, bytes: u64) -> Ref {
        self.edit_operand("an alignment", Loc::caller(), |o| {
            o.layout.align = Some(bytes)
        })
    }

    /// Sets the memory space. For `any` the block becomes the whole array.
    #[track_caller]
    pub fn space(self, space: MemorySpace) -> Ref {
        let loc = Loc::caller();
        state::with(self.builder, |st| match self.buffer {
            BufferRef::Operand(i) if i < st.sig.operands.len() => {
                let o = &mut st.sig.operands[i];
                o.space = space;
                if space == MemorySpace::Any {
                    o.block = BlockSpec::full(&o.shape);
                }
            }
            BufferRef::Scratch(i) if i < st.sig.scratch.len() => st.sig.scratch[i].space = space,
            _ => st.error(
                ErrorKind::Builder(crate::BuilderMisuse::PrefetchOutsideSmem),
                Some(loc),
            ),
        });
        self
    }

    /// An element of this scalar-prefetch operand, for use in index maps:
    /// `|[i, j]| (table.at(i), j)`.
    pub fn at(self, index: impl IntoIndexExprs) -> IndexExpr {
        let operand = match self.buffer {
            BufferRef::Prefetch(i) => i,
            // Not a prefetch ref: the verifier reports an unknown operand.
            _ => usize::MAX,
        };
        IndexExpr::Prefetch {
            operand,
            at: index.into_exprs(),
        }
    }

    /// Loads the indexed part of the buffer: `q.load(..)` for all of it,
    /// `acc.load((.., 0..128))`, `x.load((0, ds(i * 8, 8), ..))`.
    #[track_caller]
    pub fn load(self, indices: impl IntoIndices) -> Tile {
        self.load_impl(indices.into_indices(), None, Loc::caller())
    }

    /// Loads where `mask` is true; other elements are 0 and are not read.
    #[track_caller]
    pub fn load_masked(self, indices: impl IntoIndices, mask: Tile) -> Tile {
        self.load_impl(indices.into_indices(), Some(mask), Loc::caller())
    }

    fn load_impl(self, idx: Option<Vec<Idx>>, mask: Option<Tile>, loc: Loc) -> Tile {
        let id = state::with(self.builder, |st| {
            let indices = resolve(st, self.buffer, idx, &loc)?;
            let mask = match mask {
                Some(m) => Some(st.own(m, &loc)?),
                None => None,
            };
            let kind = OpKind::Load {
                buffer: self.buffer,
                indices,
                mask,
            };
            st.push_op(kind, loc).first().copied()
        })
        .flatten();
        Tile::from_parts(id, self.builder)
    }

    /// Stores `value` into the indexed part of the buffer. A number is
    /// splatted to the indexed shape.
    #[track_caller]
    pub fn store(self, indices: impl IntoIndices, value: impl IntoOperand) {
        self.store_impl(indices.into_indices(), value, None, Loc::caller())
    }

    /// Stores where `mask` is true.
    #[track_caller]
    pub fn store_masked(self, indices: impl IntoIndices, value: impl IntoOperand, mask: Tile) {
        self.store_impl(indices.into_indices(), value, Some(mask), Loc::caller())
    }

    fn store_impl(
        self,
        idx: Option<Vec<Idx>>,
        value: impl IntoOperand,
        mask: Option<Tile>,
        loc: Loc,
    ) {
        let value = value.into_operand();
        state::with(self.builder, |st| {
            let indices = resolve(st, self.buffer, idx, &loc)?;
            let view: Vec<usize> = indices
                .iter()
                .filter_map(|i| match i {
                    Index::Slice { len, .. } => Some(*len),
                    Index::Point(_) => None,
                })
                .collect();
            let dtype = st.sig.buffer(self.buffer).map(|b| b.1)?;
            let value = value.materialize(st, self.builder, &TileType::new(dtype, view), &loc)?;
            let mask = match mask {
                Some(m) => Some(st.own(m, &loc)?),
                None => None,
            };
            st.push_op(
                OpKind::Store {
                    buffer: self.buffer,
                    indices,
                    value,
                    mask,
                },
                loc,
            );
            Some(())
        });
    }
}

/// Turns builder indices into IR indices against the buffer's view shape.
pub(super) fn resolve(
    st: &mut State,
    buffer: BufferRef,
    idx: Option<Vec<Idx>>,
    loc: &Loc,
) -> Option<Vec<Index>> {
    let Some((name, _, shape)) = st
        .sig
        .buffer(buffer)
        .map(|(n, d, s)| (n.to_string(), d, s.to_vec()))
    else {
        st.error(
            ErrorKind::UnknownBuffer(format!("{buffer:?} does not exist in this kernel")),
            Some(loc.clone()),
        );
        return None;
    };
    let idx = idx.unwrap_or_else(|| vec![Idx::Full; shape.len()]);
    let mut out = Vec::with_capacity(idx.len());
    for (d, i) in idx.into_iter().enumerate() {
        let size = shape.get(d).copied().unwrap_or(0) as i64;
        let start = |st: &mut State, s: Start| -> Option<IndexValue> {
            Some(match s {
                Start::Static(v) => IndexValue::Static(v),
                Start::Dynamic(t) => IndexValue::Dynamic(st.own(t, loc)?),
            })
        };
        out.push(match i {
            Idx::Full => Index::Slice {
                start: IndexValue::Static(0),
                len: size as usize,
            },
            Idx::Range { start: s, end } => {
                let end = end.unwrap_or(size);
                if end <= s {
                    st.error(
                        ErrorKind::Index {
                            op: "load/store",
                            buffer: name.clone(),
                            detail: format!("dim {d}: the range {s}..{end} is empty"),
                        },
                        Some(loc.clone()),
                    );
                    return None;
                }
                Index::Slice {
                    start: IndexValue::Static(s),
                    len: (end - s) as usize,
                }
            }
            Idx::Point(s) => Index::Point(start(st, s)?),
            Idx::Dyn(s, len) => Index::Slice {
                start: start(st, s)?,
                len,
            },
        });
    }
    Some(out)
}

/// Loads from an optional operand (`#[present(..)]`): `kv_len.load([0])`
/// is the loaded tile when the operand is there and `None` when it is not,
/// one call where a body would otherwise fork on `if let`.
pub trait OptionalLoad {
    /// [`Ref::load`] of the operand, if present.
    fn load(self, indices: impl IntoIndices) -> Option<Tile>;
}

impl OptionalLoad for Option<Ref> {
    #[track_caller]
    fn load(self, indices: impl IntoIndices) -> Option<Tile> {
        let loc = Loc::caller();
        self.map(|r| r.load_impl(indices.into_indices(), None, loc))
    }
}
