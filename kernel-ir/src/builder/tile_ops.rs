//! Rust's operators on tiles: `+ - * / %`, the bitwise ones and shifts, `-x`, `!x`
//! and the compound assignments, each recording the op (numbers on either
//! side take the tile's dtype).

use std::ops;

use super::tile::{IntoOperand, Tile, binary};
use crate::{BinaryOp, Loc, UnaryOp};

macro_rules! binop_trait {
    ($trait:ident, $method:ident, $op:expr) => {
        impl<R: IntoOperand> ops::$trait<R> for Tile {
            type Output = Tile;
            #[track_caller]
            fn $method(self, rhs: R) -> Tile {
                binary($op, self.into_operand(), rhs.into_operand())
            }
        }
        binop_trait!(@lhs $trait, $method, $op, f32, f64, i32, i64);
    };
    (@lhs $trait:ident, $method:ident, $op:expr, $($t:ty),*) => {$(
        impl ops::$trait<Tile> for $t {
            type Output = Tile;
            #[track_caller]
            fn $method(self, rhs: Tile) -> Tile {
                binary($op, self.into_operand(), rhs.into_operand())
            }
        }
    )*};
}
binop_trait!(Add, add, BinaryOp::Add);
binop_trait!(Sub, sub, BinaryOp::Sub);
binop_trait!(Mul, mul, BinaryOp::Mul);
binop_trait!(Div, div, BinaryOp::Div);
binop_trait!(Rem, rem, BinaryOp::Rem);
binop_trait!(BitAnd, bitand, BinaryOp::And);
binop_trait!(BitOr, bitor, BinaryOp::Or);
binop_trait!(BitXor, bitxor, BinaryOp::Xor);
// `>>` is arithmetic, as on Rust's signed integers; `Tile::shr_logical`
// fills with zeros.
binop_trait!(Shl, shl, BinaryOp::ShiftLeft);
binop_trait!(Shr, shr, BinaryOp::ShiftRightArithmetic);

impl ops::Neg for Tile {
    type Output = Tile;
    #[track_caller]
    fn neg(self) -> Tile {
        self.unary(UnaryOp::Neg, Loc::caller())
    }
}

impl ops::Not for Tile {
    type Output = Tile;
    #[track_caller]
    fn not(self) -> Tile {
        self.unary(UnaryOp::Not, Loc::caller())
    }
}

macro_rules! assign_trait {
    ($trait:ident, $method:ident, $op:expr) => {
        impl<R: IntoOperand> ops::$trait<R> for Tile {
            #[track_caller]
            fn $method(&mut self, rhs: R) {
                *self = binary($op, self.into_operand(), rhs.into_operand());
            }
        }
    };
}
assign_trait!(AddAssign, add_assign, BinaryOp::Add);
assign_trait!(SubAssign, sub_assign, BinaryOp::Sub);
assign_trait!(MulAssign, mul_assign, BinaryOp::Mul);
assign_trait!(DivAssign, div_assign, BinaryOp::Div);
