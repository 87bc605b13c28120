//! Loops and conditionals.

use super::state::{self, State};
use super::tile::Tile;
use crate::error::ErrorKind;
use crate::{DType, IndexValue, Loc, OpKind, Region, TileType, ValueId};

/// Values carried through a loop or returned from branches: `()`, a
/// [`Tile`], tuples of them, or a `Vec<Tile>`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be carried through a kernel `for` loop or a branch on a tile",
    label = "this value changes inside the kernel loop or branch",
    note = "only tiles (and tuples of tiles) can change inside a kernel loop or a branch decided at run time; compute Rust values outside it, or unroll the loop with `#[unroll] for`"
)]
pub trait Carry: Sized {
    /// The tiles, in order.
    fn tiles(&self) -> Vec<Tile>;
    /// The same structure rebuilt from `tiles` (which has exactly as many
    /// as [`Carry::tiles`] returned).
    fn rebuild(&self, tiles: &mut dyn Iterator<Item = Tile>) -> Self;
}

impl Carry for () {
    fn tiles(&self) -> Vec<Tile> {
        Vec::new()
    }
    fn rebuild(&self, _: &mut dyn Iterator<Item = Tile>) -> Self {}
}

impl Carry for Tile {
    fn tiles(&self) -> Vec<Tile> {
        vec![*self]
    }
    fn rebuild(&self, tiles: &mut dyn Iterator<Item = Tile>) -> Self {
        tiles.next().unwrap_or(*self)
    }
}

impl Carry for Vec<Tile> {
    fn tiles(&self) -> Vec<Tile> {
        self.clone()
    }
    fn rebuild(&self, tiles: &mut dyn Iterator<Item = Tile>) -> Self {
        self.iter().map(|t| tiles.next().unwrap_or(*t)).collect()
    }
}

macro_rules! tuple_carry {
    ($($name:ident . $i:tt),+) => {
        impl<$($name: Carry),+> Carry for ($($name,)+) {
            fn tiles(&self) -> Vec<Tile> {
                let mut v = Vec::new();
                $(v.extend(self.$i.tiles());)+
                v
            }
            fn rebuild(&self, tiles: &mut dyn Iterator<Item = Tile>) -> Self {
                ($(self.$i.rebuild(tiles),)+)
            }
        }
    };
}
tuple_carry!(A.0);
tuple_carry!(A.0, B.1);
tuple_carry!(A.0, B.1, C.2);
tuple_carry!(A.0, B.1, C.2, D.3);
tuple_carry!(A.0, B.1, C.2, D.3, E.4);
tuple_carry!(A.0, B.1, C.2, D.3, E.4, F.5);
tuple_carry!(A.0, B.1, C.2, D.3, E.4, F.5, G.6);
tuple_carry!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7);

/// A loop bound: a number or an i32 scalar tile.
#[derive(Clone, Copy, Debug)]
pub enum Bound {
    /// Known now.
    Static(i64),
    /// Known at run time.
    Dynamic(Tile),
}

macro_rules! int_bound {
    ($($t:ty),*) => {$(
        impl From<$t> for Bound {
            fn from(v: $t) -> Self {
                Bound::Static(v as i64)
            }
        }
    )*};
}
int_bound!(i32, i64, usize);

impl From<Tile> for Bound {
    fn from(t: Tile) -> Self {
        Bound::Dynamic(t)
    }
}

fn builder_for(tiles: &[Tile]) -> u32 {
    tiles
        .first()
        .map(|t| t.builder)
        .or_else(state::current)
        .unwrap_or(0)
}

/// Opens a region whose args have `types`; returns the arg tiles.
pub(super) fn open(st: &mut State, types: Vec<Option<TileType>>, builder: u32) -> Vec<Tile> {
    let args: Vec<ValueId> = types.into_iter().map(|t| st.new_value(t)).collect();
    st.regions.push(Region {
        args: args.clone(),
        ..Region::default()
    });
    args.into_iter().map(|id| Tile { id, builder }).collect()
}

/// Closes the innermost region, yielding `yields`.
pub(super) fn close(builder: u32, yields: &[Tile], loc: &Loc) -> Region {
    state::with(builder, |st| {
        let ids: Vec<ValueId> = yields.iter().filter_map(|t| st.own(*t, loc)).collect();
        let mut region = if st.regions.len() > 1 {
            st.regions.pop().unwrap_or_default()
        } else {
            st.error(
                ErrorKind::Builder(crate::BuilderMisuse::NoRegionOpen),
                Some(loc.clone()),
            );
            Region::default()
        };
        region.yields = ids;
        region
    })
    .unwrap_or_default()
}

fn results(builder: u32, kind: OpKind, loc: Loc) -> Vec<Tile> {
    state::with(builder, |st| st.push_op(kind, loc))
        .unwrap_or_default()
        .into_iter()
        .map(|id| Tile { id, builder })
        .collect()
}

/// A loop `for i in lower..upper` carrying `init` through `body`, which
/// gets the index (an i32 scalar) and the carried values and returns their
/// next values. Returns the final carried values. Built as one loop op, not
/// unrolled.
#[track_caller]
pub fn for_range<C: Carry>(
    lower: impl Into<Bound>,
    upper: impl Into<Bound>,
    init: C,
    body: impl FnOnce(Tile, C) -> C,
) -> C {
    for_range_impl(lower.into(), upper.into(), 1, init, body, Loc::caller())
}

/// [`for_range`] with a step other than 1.
#[track_caller]
pub fn for_range_step<C: Carry>(
    lower: impl Into<Bound>,
    upper: impl Into<Bound>,
    step: i64,
    init: C,
    body: impl FnOnce(Tile, C) -> C,
) -> C {
    for_range_impl(lower.into(), upper.into(), step, init, body, Loc::caller())
}

fn for_range_impl<C: Carry>(
    lower: Bound,
    upper: Bound,
    step: i64,
    init: C,
    body: impl FnOnce(Tile, C) -> C,
    loc: Loc,
) -> C {
    let init_tiles = init.tiles();
    let builder = builder_for(&init_tiles);
    let opened = state::with(builder, |st| {
        let bound = |st: &mut State, b: Bound| -> Option<IndexValue> {
            Some(match b {
                Bound::Static(v) => IndexValue::Static(v),
                Bound::Dynamic(t) => IndexValue::Dynamic(st.own(t, &loc)?),
            })
        };
        let lo = bound(st, lower);
        let hi = bound(st, upper);
        let init_ids: Vec<ValueId> = init_tiles.iter().filter_map(|t| st.own(*t, &loc)).collect();
        let mut types = vec![Some(TileType::scalar(DType::I32))];
        types.extend(init_ids.iter().map(|v| st.ty(*v).cloned()));
        let args = open(st, types, builder);
        (lo, hi, init_ids, args)
    });
    let Some((lo, hi, init_ids, args)) = opened else {
        return init;
    };
    let carried = init.rebuild(&mut args[1..].iter().copied());
    let next = body(args[0], carried);
    let region = close(builder, &next.tiles(), &loc);
    let (Some(lower), Some(upper)) = (lo, hi) else {
        return init;
    };
    if init_ids.len() != init_tiles.len() {
        return init;
    }
    let kind = OpKind::For {
        lower,
        upper,
        step,
        init: init_ids,
        body: region,
        unroll: false,
    };
    let res = results(builder, kind, loc);
    init.rebuild(&mut res.into_iter())
}

/// Runs `body` only when the bool scalar `cond` holds (Pallas `pl.when`).
#[track_caller]
pub fn when(cond: Tile, body: impl FnOnce()) {
    if_else(cond, body, || ())
}

/// `if cond { then() } else { otherwise() }` on a bool scalar; both
/// branches return values of the same types.
#[track_caller]
pub fn if_else<C: Carry>(cond: Tile, then: impl FnOnce() -> C, otherwise: impl FnOnce() -> C) -> C {
    let loc = Loc::caller();
    let builder = cond.builder;
    let Some(c) = state::with(builder, |st| st.own(cond, &loc)).flatten() else {
        // Still run the branches so their errors are reported too.
        let r = then();
        let _ = otherwise();
        return r;
    };
    state::with(builder, |st| open(st, Vec::new(), builder));
    let t = then();
    let then_region = close(builder, &t.tiles(), &loc);
    state::with(builder, |st| open(st, Vec::new(), builder));
    let e = otherwise();
    let else_region = close(builder, &e.tiles(), &loc);
    let kind = OpKind::If {
        cond: c,
        then_region,
        else_region,
    };
    let res = results(builder, kind, loc);
    t.rebuild(&mut res.into_iter())
}
