//! A thin layer over melior: one context per lowering, generic op
//! construction, the types and attributes every target needs.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use melior::Context;
use melior::dialect::DialectRegistry;
use melior::ir::attribute::{
    ArrayAttribute, DenseI32ArrayAttribute, DenseI64ArrayAttribute, FlatSymbolRefAttribute,
    IntegerAttribute, StringAttribute, TypeAttribute,
};
use melior::ir::operation::{OperationBuilder, OperationLike};
use melior::ir::r#type::{FunctionType, IntegerType, MemRefType, RankedTensorType};
use melior::ir::{
    Attribute, Block, BlockLike, Identifier, Location, Module, Region, RegionLike, Type, TypeLike,
    Value, ValueLike,
};
use melior::utility::register_all_dialects;
use mlir_sys::MlirValue;

use kernel_ir::{DType, TileType};

use crate::LoweringError;

/// A value handle that outlives the borrow of the block that made it.
///
/// melior ties a `Value` to the block it lives in; our emitters keep values
/// in maps across nested regions, whose scoping the kernel IR guarantees, so
/// they store the raw handle.
pub(crate) type Raw = MlirValue;

/// An MLIR context set up for Tessera: the upstream dialects the targets use
/// loaded, unregistered dialects (stablehlo, tpu) allowed, diagnostics
/// collected for error messages.
pub(crate) struct Mlir {
    pub ctx: Context,
    diagnostics: Rc<RefCell<Vec<String>>>,
}

impl Mlir {
    pub fn new() -> Mlir {
        let registry = DialectRegistry::new();
        register_all_dialects(&registry);
        let ctx = Context::new();
        ctx.append_dialect_registry(&registry);
        for d in [
            "builtin", "func", "arith", "math", "vector", "memref", "scf",
        ] {
            ctx.get_or_load_dialect(d);
        }
        ctx.set_allow_unregistered_dialects(true);
        let diagnostics = Rc::new(RefCell::new(Vec::new()));
        let sink = diagnostics.clone();
        ctx.attach_diagnostic_handler(move |d| {
            sink.borrow_mut().push(d.to_string());
            true
        });
        Mlir { ctx, diagnostics }
    }

    /// Forgets the diagnostics collected so far.
    pub fn clear_diagnostics(&self) {
        self.diagnostics.borrow_mut().clear();
    }

    /// The diagnostics collected since the last clear, one per line.
    pub fn diagnostics(&self) -> String {
        self.diagnostics.borrow().join("\n")
    }

    /// Verifies a module; on failure returns MLIR's diagnostics.
    pub fn verify(&self, module: &Module, what: &'static str) -> Result<(), LoweringError> {
        self.diagnostics.borrow_mut().clear();
        if module.as_operation().verify() {
            Ok(())
        } else {
            Err(LoweringError::Mlir {
                what,
                message: self.diagnostics.borrow().join("\n"),
            })
        }
    }
}

/// Builds ops into blocks; `prefix` renames every op (Mosaic's serialized
/// form prefixes `stable_mosaic.`).
pub(crate) struct Ir<'c> {
    pub ctx: &'c Context,
    /// The location new ops get: the kernel source line of the op being
    /// lowered, else unknown.
    loc: Cell<Location<'c>>,
    pub prefix: &'static str,
}

/// An attribute list under construction.
pub(crate) type Attrs<'c> = Vec<(&'static str, Attribute<'c>)>;

impl<'c> Ir<'c> {
    pub fn new(ctx: &'c Context, prefix: &'static str) -> Ir<'c> {
        Ir {
            ctx,
            loc: Cell::new(Location::unknown(ctx)),
            prefix,
        }
    }

    /// The location new ops get.
    pub fn loc(&self) -> Location<'c> {
        self.loc.get()
    }

    /// Ops built from here on carry `loc` (as returned by [`Ir::loc`]).
    pub fn restore_loc(&self, loc: Location<'c>) {
        self.loc.set(loc);
    }

    /// Ops built from here on carry `loc` (the kernel author's
    /// `file:line:col`), or an unknown location for `None`. Printed modules
    /// do not show locations; bytecode keeps them, so a compiler error
    /// about an op names the Rust line it came from.
    pub fn set_loc(&self, loc: Option<&kernel_ir::Loc>) {
        self.loc.set(match loc {
            Some(l) => Location::new(self.ctx, &l.file, l.line as usize, l.column as usize),
            None => Location::unknown(self.ctx),
        });
    }

    /// Appends op `name` to `block` and returns its results.
    pub fn op(
        &self,
        block: &Block<'c>,
        name: &str,
        operands: &[Raw],
        results: &[Type<'c>],
        attrs: Attrs<'c>,
        regions: Vec<Region<'c>>,
    ) -> Result<Vec<Raw>, LoweringError> {
        let op = self.build(name, operands, results, attrs, regions)?;
        let op = block.append_operation(op);
        Ok(op.results().map(|r| Value::from(r).to_raw()).collect())
    }

    /// Appends an op with exactly one result.
    pub fn op1(
        &self,
        block: &Block<'c>,
        name: &str,
        operands: &[Raw],
        result: Type<'c>,
        attrs: Attrs<'c>,
    ) -> Result<Raw, LoweringError> {
        self.op(block, name, operands, &[result], attrs, Vec::new())?
            .first()
            .copied()
            .ok_or_else(|| LoweringError::Internal(format!("{name} made no result")))
    }

    /// Builds (but does not place) an op.
    pub fn build(
        &self,
        name: &str,
        operands: &[Raw],
        results: &[Type<'c>],
        attrs: Attrs<'c>,
        regions: Vec<Region<'c>>,
    ) -> Result<melior::ir::Operation<'c>, LoweringError> {
        let full = format!("{}{name}", self.prefix);
        // SAFETY: every raw value comes from an op or block argument that is
        // still alive: regions are nested and values are used in scope.
        let values: Vec<Value<'c, '_>> = operands
            .iter()
            .map(|&v| unsafe { Value::from_raw(v) })
            .collect();
        let named: Vec<(Identifier<'c>, Attribute<'c>)> = attrs
            .into_iter()
            .map(|(k, v)| (Identifier::new(self.ctx, k), v))
            .collect();
        OperationBuilder::new(&full, self.loc())
            .add_operands(&values)
            .add_results(results)
            .add_attributes(&named)
            .add_regions_vec(regions)
            .build()
            .map_err(|e| LoweringError::Internal(format!("building {full}: {e}")))
    }

    /// The public `func.func @main` of a StableHLO module: `body` takes
    /// `inputs` and returns `outputs`.
    pub fn public_main(
        &self,
        body: Block<'c>,
        inputs: &[Type<'c>],
        outputs: &[Type<'c>],
    ) -> Result<melior::ir::Operation<'c>, LoweringError> {
        self.public_main_donating(body, inputs, outputs, &[])
    }

    /// [`Ir::public_main`] whose arguments `donated[j].0` may be reused
    /// for results `donated[j].1` (`tf.aliasing_output`, as JAX marks a
    /// donated argument): XLA then writes such a result in place instead
    /// of copying the argument first.
    pub fn public_main_donating(
        &self,
        body: Block<'c>,
        inputs: &[Type<'c>],
        outputs: &[Type<'c>],
        donated: &[(usize, usize)],
    ) -> Result<melior::ir::Operation<'c>, LoweringError> {
        let mut attrs = vec![
            ("sym_name", self.str_attr("main")),
            ("sym_visibility", self.str_attr("public")),
            (
                "function_type",
                self.type_attr(self.func_type(inputs, outputs)),
            ),
        ];
        if !donated.is_empty() {
            let args: Vec<String> = (0..inputs.len())
                .map(|a| match donated.iter().find(|(arg, _)| *arg == a) {
                    Some((_, r)) => format!("{{tf.aliasing_output = {r} : i32}}"),
                    None => "{}".into(),
                })
                .collect();
            attrs.push((
                "arg_attrs",
                self.parse_attr(&format!("[{}]", args.join(", ")))?,
            ));
        }
        self.build("func.func", &[], &[], attrs, vec![self.region(body)])
    }

    /// A block with arguments of these types.
    pub fn block(&self, args: &[Type<'c>]) -> Block<'c> {
        let a: Vec<(Type<'c>, Location<'c>)> = args.iter().map(|&t| (t, self.loc())).collect();
        Block::new(&a)
    }

    /// A region holding `block`.
    pub fn region(&self, block: Block<'c>) -> Region<'c> {
        let r = Region::new();
        r.append_block(block);
        r
    }

    /// The raw handles of a block's arguments.
    pub fn args(&self, block: &Block<'c>) -> Vec<Raw> {
        (0..block.argument_count())
            .filter_map(|i| block.argument(i).ok())
            .map(|a| Value::from(a).to_raw())
            .collect()
    }

    // ---- types ----

    pub fn elem(&self, d: DType) -> Type<'c> {
        match d {
            DType::F32 => Type::float32(self.ctx),
            DType::BF16 => Type::bfloat16(self.ctx),
            DType::F16 => Type::float16(self.ctx),
            DType::I32 => IntegerType::new(self.ctx, 32).into(),
            DType::I8 => IntegerType::new(self.ctx, 8).into(),
            DType::Bool => IntegerType::new(self.ctx, 1).into(),
            // Builtin MLIR types; parsing them cannot fail.
            DType::F8E4M3FN => Type::parse(self.ctx, "f8E4M3FN").unwrap_or_else(|| self.i8()),
            DType::F8E5M2 => Type::parse(self.ctx, "f8E5M2").unwrap_or_else(|| self.i8()),
        }
    }

    fn i8(&self) -> Type<'c> {
        IntegerType::new(self.ctx, 8).into()
    }

    pub fn i32(&self) -> Type<'c> {
        IntegerType::new(self.ctx, 32).into()
    }

    pub fn i1(&self) -> Type<'c> {
        IntegerType::new(self.ctx, 1).into()
    }

    pub fn index(&self) -> Type<'c> {
        Type::index(self.ctx)
    }

    /// A tile's type in a kernel module: a scalar for rank 0, else a vector.
    pub fn tile(&self, t: &TileType) -> Type<'c> {
        self.shaped_vector(&t.shape, self.elem(t.dtype))
    }

    pub fn shaped_vector(&self, shape: &[usize], elem: Type<'c>) -> Type<'c> {
        if shape.is_empty() {
            elem
        } else {
            let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
            Type::vector(&dims, elem)
        }
    }

    pub fn tensor(&self, shape: &[usize], d: DType) -> Type<'c> {
        let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        RankedTensorType::new(&dims, self.elem(d), None).into()
    }

    /// A memref; `memory_space` may be an attribute MLIR's type verifier
    /// would reject (a `#tpu` attribute outside the tpu dialect), which is
    /// why this uses the unchecked constructor: MLIR only verifies types
    /// when it parses them.
    pub fn memref(
        &self,
        shape: &[usize],
        d: DType,
        strides: Option<&[usize]>,
        memory_space: Option<Attribute<'c>>,
    ) -> Type<'c> {
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let layout = strides.map(|s| {
            let s: Vec<i64> = s.iter().map(|&x| x as i64).collect();
            melior::ir::attribute::StridedLayoutAttribute::new(self.ctx, 0, &s).into()
        });
        MemRefType::new(self.elem(d), &dims, layout, memory_space).into()
    }

    /// A memref of any element type (unchecked, like [`Ir::memref`]): the
    /// form for Mosaic's semaphore memrefs, whose element types come from
    /// the tpu dialect, which this context does not load.
    pub fn memref_of(
        &self,
        elem: Type<'c>,
        shape: &[usize],
        memory_space: Option<Attribute<'c>>,
    ) -> Type<'c> {
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        MemRefType::new(elem, &dims, None, memory_space).into()
    }

    /// Parses a type (an opaque one for a dialect this context lacks).
    pub fn parse_type(&self, text: &str) -> Result<Type<'c>, LoweringError> {
        Type::parse(self.ctx, text)
            .ok_or_else(|| LoweringError::Internal(format!("cannot parse the type {text}")))
    }

    pub fn func_type(&self, inputs: &[Type<'c>], results: &[Type<'c>]) -> Type<'c> {
        FunctionType::new(self.ctx, inputs, results).into()
    }

    // ---- attributes ----

    /// Parses an attribute (for the few with no melior constructor).
    pub fn parse_attr(&self, text: &str) -> Result<Attribute<'c>, LoweringError> {
        Attribute::parse(self.ctx, text)
            .ok_or_else(|| LoweringError::Internal(format!("cannot parse attribute `{text}`")))
    }

    pub fn i64_attr(&self, v: i64) -> Attribute<'c> {
        IntegerAttribute::new(IntegerType::new(self.ctx, 64).into(), v).into()
    }

    pub fn i32_attr(&self, v: i64) -> Attribute<'c> {
        IntegerAttribute::new(self.i32(), v).into()
    }

    pub fn index_attr(&self, v: i64) -> Attribute<'c> {
        IntegerAttribute::new(self.index(), v).into()
    }

    pub fn bool_attr(&self, v: bool) -> Attribute<'c> {
        melior::ir::attribute::BoolAttribute::new(self.ctx, v).into()
    }

    pub fn str_attr(&self, s: &str) -> Attribute<'c> {
        StringAttribute::new(self.ctx, s).into()
    }

    pub fn type_attr(&self, t: Type<'c>) -> Attribute<'c> {
        TypeAttribute::new(t).into()
    }

    pub fn array_attr(&self, items: &[Attribute<'c>]) -> Attribute<'c> {
        ArrayAttribute::new(self.ctx, items).into()
    }

    pub fn i64_array(&self, v: &[i64]) -> Attribute<'c> {
        DenseI64ArrayAttribute::new(self.ctx, v).into()
    }

    pub fn i32_array(&self, v: &[i32]) -> Attribute<'c> {
        DenseI32ArrayAttribute::new(self.ctx, v).into()
    }

    pub fn symbol(&self, name: &str) -> Attribute<'c> {
        FlatSymbolRefAttribute::new(self.ctx, name).into()
    }

    pub fn dict(&self, items: &[(&str, Attribute<'c>)]) -> Attribute<'c> {
        let named: Vec<(Identifier<'c>, Attribute<'c>)> = items
            .iter()
            .map(|(k, v)| (Identifier::new(self.ctx, k), *v))
            .collect();
        melior::ir::attribute::DictionaryAttribute::new(self.ctx, &named).into()
    }

    /// A constant of `ty` (scalar or splat vector/tensor) holding `v`,
    /// written as the bit pattern of the element type so that the value is
    /// exact (and infinities and NaN need no special syntax).
    pub fn literal(&self, v: f64, d: DType, ty: Type<'c>) -> Result<Attribute<'c>, LoweringError> {
        let elem = literal_text(v, d);
        let text = if ty.is_vector() || ty.is_ranked_tensor() {
            format!("dense<{elem}> : {ty}")
        } else if d == DType::Bool {
            // A scalar i1 is MLIR's `true`/`false` (`true : i1` does not parse).
            elem
        } else {
            format!("{elem} : {ty}")
        };
        self.parse_attr(&text)
    }
}

/// `dense<..>` of `a`'s values nested by its shape (the attribute of a
/// `stablehlo.constant` of `a`'s tensor type, which the caller appends).
pub fn dense_literal(a: &kernel_ir::Array) -> String {
    fn nest(out: &mut String, shape: &[usize], vals: &[f64], d: DType) {
        match shape.split_first() {
            None => out.push_str(&literal_text(vals[0], d)),
            Some((&n, rest)) => {
                let step: usize = rest.iter().product();
                out.push('[');
                for i in 0..n {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    nest(out, rest, &vals[i * step..(i + 1) * step], d);
                }
                out.push(']');
            }
        }
    }
    let mut body = String::new();
    if a.is_empty() {
        body.push_str("[]");
    } else {
        nest(&mut body, a.shape(), a.data(), a.dtype());
    }
    format!("dense<{body}>")
}

/// The text of one element of dtype `d` with value `v` in MLIR syntax
/// (floats as exact bit patterns, so infinities and NaN need no special
/// form).
pub fn literal_text(v: f64, d: DType) -> String {
    match d {
        DType::F32 => format!("0x{:08X}", (v as f32).to_bits()),
        DType::BF16 => format!("0x{:04X}", half::bf16::from_f64(v).to_bits()),
        DType::F16 => format!("0x{:04X}", half::f16::from_f64(v).to_bits()),
        DType::Bool => (if d.round(v) != 0.0 { "true" } else { "false" }).to_string(),
        DType::I32 | DType::I8 => format!("{}", d.round(v) as i64),
        DType::F8E4M3FN => format!("0x{:02X}", kernel_ir::fp8::E4M3FN.encode(v)),
        DType::F8E5M2 => format!("0x{:02X}", kernel_ir::fp8::E5M2.encode(v)),
    }
}
