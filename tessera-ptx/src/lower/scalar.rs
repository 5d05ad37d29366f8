//! Scalar expressions, and the dispatch from expressions to values.

use super::{scalar_class, Lowerer, TileVal, Value};
use crate::dtype::{DType, ScalarType};
use crate::error::CompileError;
use crate::tirh::{BinOp, Builtin, Expr, ExprKind, Type, UnOp};
use crate::tirt::{Operand, Reg, RegClass};

impl Lowerer<'_> {
    /// Lowers any expression.
    pub(crate) fn expr(&mut self, e: &Expr) -> Result<Value, CompileError> {
        if let Some(v) = self.hopper_expr(e) {
            return v;
        }
        match e.checked_ty() {
            Type::Tile(_) => Ok(Value::Tile(self.tile(e)?)),
            Type::Scalar(s) => Ok(Value::Scalar(self.scalar(e)?, s)),
            _ => match &e.kind {
                ExprKind::Var(n) => Ok(self.lookup(n)),
                _ => unreachable!("verified TIR-H: globals, rings and pipelines are only named"),
            },
        }
    }

    /// Moves an operand into a register if it is an immediate.
    pub(crate) fn in_reg(&mut self, op: Operand, s: ScalarType, hint: &str) -> Reg {
        match op {
            Operand::Reg(r) => r,
            other if s == ScalarType::Bool => {
                let t = self.reg(RegClass::B32, hint);
                self.op("mov.b32", vec![Operand::Reg(t), other]);
                let r = self.reg(RegClass::Pred, hint);
                self.op("setp.ne.u32", vec![Operand::Reg(r), Operand::Reg(t), Operand::Imm(0)]);
                r
            }
            other => {
                let r = self.reg(scalar_class(s), hint);
                self.op(super::mov_for(scalar_class(s)), vec![Operand::Reg(r), other]);
                r
            }
        }
    }

    /// Lowers a scalar expression to an operand (a register or an immediate).
    pub(crate) fn scalar(&mut self, e: &Expr) -> Result<Operand, CompileError> {
        use Operand::{Imm, Reg as R, Sym};
        let Type::Scalar(ty) = e.checked_ty() else { unreachable!("verified TIR-H: a scalar") };
        Ok(match &e.kind {
            ExprKind::Var(n) => match self.lookup(n) {
                Value::Scalar(op, _) => op,
                _ => unreachable!("verified TIR-H: `{n}` is a scalar"),
            },
            ExprKind::Int(v) => Imm(*v),
            ExprKind::Float(v) => Operand::F32(*v as f32),
            ExprKind::Bool(b) => Imm(i64::from(*b)),
            ExprKind::Builtin(b) => match b {
                Builtin::WarpgroupId => R(self.wg),
                Builtin::BlockId(a) | Builtin::GridDim(a) => {
                    let base = if matches!(b, Builtin::BlockId(_)) { "%ctaid" } else { "%nctaid" };
                    let axis = ["x", "y", "z"][usize::from(*a).min(2)];
                    let r = self.reg(RegClass::B32, &format!("{}_{axis}", &base[1..]));
                    self.op("mov.u32", vec![R(r), Sym(format!("{base}.{axis}"))]);
                    R(r)
                }
            },
            ExprKind::Dim { tensor, axis } => {
                let g = self.global(tensor);
                let sym = format!("{}_dim{axis}", g.name);
                // Copied: the cached register is only valid within this statement.
                let d = self.global_regs(&g).dims[*axis as usize];
                let r = self.reg(RegClass::B32, &sym);
                self.op("mov.b32", vec![R(r), R(d)]);
                R(r)
            }
            ExprKind::Cast { value, to } => {
                let Type::Scalar(from) = value.checked_ty() else { unreachable!("verified TIR-H: scalar cast") };
                let v = self.scalar(value)?;
                match (from, to) {
                    (ScalarType::I32, DType::F32) => {
                        let r = self.reg(RegClass::F32, "cvt");
                        self.op("cvt.rn.f32.s32", vec![R(r), v]);
                        R(r)
                    }
                    (ScalarType::F32, DType::I32) => {
                        let r = self.reg(RegClass::B32, "cvt");
                        self.op("cvt.rzi.s32.f32", vec![R(r), v]);
                        R(r)
                    }
                    _ => v,
                }
            }
            ExprKind::Unary(op, a) => {
                let v = self.scalar(a)?;
                match (op, &v) {
                    (UnOp::Not, Imm(b)) => return Ok(Imm(i64::from(*b == 0))),
                    (UnOp::Neg, Imm(x)) if ty == ScalarType::I32 => {
                        if let Some(n) = i32::try_from(*x).ok().and_then(i32::checked_neg) {
                            return Ok(Imm(i64::from(n)));
                        }
                    }
                    _ => {}
                }
                match (op, ty) {
                    (UnOp::Not, _) | (UnOp::Neg, ScalarType::I32) => {
                        let r = self.reg(scalar_class(ty), "t");
                        let inst = if *op == UnOp::Not { "not.pred" } else { "neg.s32" };
                        self.op(inst, vec![R(r), v]);
                        R(r)
                    }
                    _ => {
                        let x = self.in_reg(v, ScalarType::F32, "x");
                        R(self.f32_unary(*op, x))
                    }
                }
            }
            ExprKind::Binary(op, a, b) => {
                let Type::Scalar(operand_ty) = a.checked_ty() else { unreachable!("verified TIR-H: scalar operands") };
                let va = self.scalar(a)?;
                let vb = self.scalar(b)?;
                if let (Imm(x), Imm(y)) = (&va, &vb) {
                    // Constants fold here: ptxas leaves `mov 128; div.s32 …, 32` as a division
                    // by a reciprocal computed at run time (a tuned `D / 32` in a ring index).
                    if let Some(v) = fold(*op, operand_ty, *x, *y) {
                        return Ok(Imm(v));
                    }
                }
                // Predicates take no immediates.
                let vb = if operand_ty == ScalarType::Bool { R(self.in_reg(vb, operand_ty, "rhs")) } else { vb };
                let va = self.in_reg(va, operand_ty, "lhs");
                if let (Imm(d), ScalarType::I32, BinOp::Div | BinOp::Rem) = (&vb, operand_ty, op) {
                    if *d > 1 && d.count_ones() == 1 && *d <= 1 << 30 {
                        return Ok(R(self.div_pow2(*op, va, d.trailing_zeros())));
                    }
                }
                let va = R(va);
                let r = self.reg(scalar_class(ty), "t");
                self.op(&scalar_binop(*op, operand_ty), vec![R(r), va, vb]);
                R(r)
            }
            ExprKind::Get { tensor, index } => {
                let g = self.global(tensor);
                let idx = index.iter().map(|i| self.scalar(i)).collect::<Result<Vec<_>, _>>()?;
                R(self.get(&g, &idx, ty))
            }
            ExprKind::TileAll(value) => {
                let t = self.tile(value)?;
                R(self.tile_all(&t))
            }
            // A pipeline's stage (`pipe.wait() + 1`), lowered with the other Hopper forms.
            _ => match self.hopper_expr(e) {
                Some(Ok(Value::Scalar(op, _))) => op,
                Some(Err(err)) => return Err(err),
                _ => unreachable!("verified TIR-H: not a scalar expression"),
            },
        })
    }
}

/// 2ᶠ on [−½, ½] for [`UnOp::Exp2Fma`]: coefficients of f⁰…f⁵, a weighted least-squares fit
/// to the relative error (2.1·10⁻⁷ at most, evaluated in f32 by Horner's rule).
pub const EXP2_POLY: [f32; 6] = [1.000_000_1, 0.693_146_94, 0.240_221_2, 0.055_507_135, 0.009_675_541, 0.001_327_646_7];

impl Lowerer<'_> {
    /// `tile_all(t)`: each thread's registers tested `≥ 0` (`setp.ge` is false for NaN) and
    /// joined, then the warpgroup's 128 threads joined by `bar.red.and.pred` on its own barrier.
    fn tile_all(&mut self, t: &TileVal) -> Reg {
        use Operand::{Imm, Reg as R, F32};
        let mine = self.reg(RegClass::Pred, "all");
        for (k, &r) in t.regs.iter().enumerate() {
            let x = self.widen_f32(r, t.ty.dtype);
            if k == 0 {
                self.op("setp.ge.f32", vec![R(mine), R(x), F32(0.0)]);
            } else {
                self.op("setp.ge.and.f32", vec![R(mine), R(x), F32(0.0), R(mine)]);
            }
        }
        let all = self.reg(RegClass::Pred, "all");
        let id = self.warpgroup_barid();
        self.op("bar.red.and.pred", vec![R(all), id, Imm(128), R(mine)]);
        all
    }

    /// `x / 2^k` or `x % 2^k` for a signed `x`, truncating toward zero as `div.s32` does, by
    /// shifts: ptxas turns `div.s32`/`rem.s32` by a constant into a division by a reciprocal
    /// computed at run time (about twenty instructions where these are four or five).
    fn div_pow2(&mut self, op: BinOp, x: Reg, k: u32) -> Reg {
        use Operand::{Imm, Reg as R};
        let t = |lw: &mut Self| lw.reg(RegClass::B32, "t");
        // A negative x is biased by 2^k − 1 so that the arithmetic shift truncates toward 0.
        let bias = t(self);
        self.op("shr.s32", vec![R(bias), R(x), Imm(31)]);
        self.op("shr.u32", vec![R(bias), R(bias), Imm(i64::from(32 - k))]);
        let biased = t(self);
        self.op("add.s32", vec![R(biased), R(x), R(bias)]);
        let r = t(self);
        if op == BinOp::Div {
            self.op("shr.s32", vec![R(r), R(biased), Imm(i64::from(k))]);
        } else {
            // x − (x / 2^k)·2^k: the biased value's low bits cleared, taken from x.
            self.op("and.b32", vec![R(biased), R(biased), Imm(-(1i64 << k))]);
            self.op("sub.s32", vec![R(r), R(x), R(biased)]);
        }
        r
    }

    /// 2ˣ on the FMA pipe ([`UnOp::Exp2Fma`]): `t = clamp(x, −127, 127)`, `r = t + 1.5·2²³`
    /// (round to nearest: `j` in `r`'s low mantissa bits), `f = t − (r − 1.5·2²³)`, 2ᶠ by
    /// Horner's rule ([`EXP2_POLY`]), `j << 23` added to its bits; 0 where `x ≥ −126.5` fails.
    fn exp2_fma(&mut self, x: Reg) -> Reg {
        use Operand::{Imm, Reg as R, F32};
        const MAGIC: f32 = 12_582_912.0;
        let f = |lw: &mut Self| lw.reg(RegClass::F32, "e2");
        let t = f(self);
        self.op("max.f32", vec![R(t), R(x), F32(-127.0)]);
        self.op("min.f32", vec![R(t), R(t), F32(127.0)]);
        let r = f(self);
        self.op("add.rn.f32", vec![R(r), R(t), F32(MAGIC)]);
        let j = f(self);
        self.op("sub.rn.f32", vec![R(j), R(r), F32(MAGIC)]);
        let fr = f(self);
        self.op("sub.rn.f32", vec![R(fr), R(t), R(j)]);
        let mut p = f(self);
        self.op("mov.f32", vec![R(p), F32(EXP2_POLY[5])]);
        for c in EXP2_POLY[..5].iter().rev() {
            let q = f(self);
            self.op("fma.rn.f32", vec![R(q), R(p), R(fr), F32(*c)]);
            p = q;
        }
        // (Integer arithmetic on the floats' bits: `.b32` copies first.)
        let (rb, pb) = (self.reg(RegClass::B32, "e2"), self.reg(RegClass::B32, "e2"));
        self.op("mov.b32", vec![R(rb), R(r)]);
        self.op("mov.b32", vec![R(pb), R(p)]);
        let e = self.reg(RegClass::B32, "e2");
        self.op("shl.b32", vec![R(e), R(rb), Imm(23)]);
        let y = self.reg(RegClass::B32, "e2");
        self.op("add.s32", vec![R(y), R(pb), R(e)]);
        let ok = self.reg(RegClass::Pred, "e2");
        self.op("setp.ge.f32", vec![R(ok), R(x), F32(-126.5)]);
        let out = f(self);
        self.op("selp.b32", vec![R(out), R(y), Imm(0), R(ok)]);
        out
    }

    /// A unary float function of `x`.
    pub(crate) fn f32_unary(&mut self, op: UnOp, x: Reg) -> Reg {
        use Operand::{Reg as R, F32};
        let one = |lw: &mut Self, inst: &str| {
            let r = lw.reg(RegClass::F32, op.name());
            lw.op(inst, vec![R(r), R(x)]);
            r
        };
        match op {
            UnOp::Neg => one(self, "neg.f32"),
            // ftz: one MUFU op (results below 2⁻¹²⁶ flush to 0; the full form adds fix-ups).
            UnOp::Exp2 | UnOp::Exp2Split => one(self, "ex2.approx.ftz.f32"),
            UnOp::Exp2Fma => self.exp2_fma(x),
            UnOp::Log2 => one(self, "lg2.approx.f32"),
            UnOp::Abs => one(self, "abs.f32"),
            UnOp::Sqrt => one(self, "sqrt.rn.f32"),
            UnOp::Rsqrt => one(self, "rsqrt.approx.f32"),
            UnOp::Tanh => one(self, "tanh.approx.f32"),
            UnOp::Floor => one(self, "cvt.rmi.f32.f32"),
            UnOp::SinReduced => one(self, "sin.approx.f32"),
            UnOp::CosReduced => one(self, "cos.approx.f32"),
            UnOp::Step => {
                // `set` with an f32 destination writes 1.0 or 0.0 (false for NaN).
                let r = self.reg(RegClass::F32, "step");
                self.op("set.ge.f32.f32", vec![R(r), R(x), F32(0.0)]);
                r
            }
            UnOp::Sin | UnOp::Cos => {
                // The hardware's sin/cos are accurate near 0 only: subtract the nearest multiple
                // of 2π first, 2π split in two f32s so that k·2π is nearly exact (Cody–Waite).
                const TWO_PI_HI: f32 = 6.283_185_5;
                const TWO_PI_LO: f32 = -1.748_455_5e-7;
                let f = |lw: &mut Self| lw.reg(RegClass::F32, "trig");
                let k = f(self);
                self.op("mul.f32", vec![R(k), R(x), F32(1.0 / std::f32::consts::TAU)]);
                self.op("cvt.rni.f32.f32", vec![R(k), R(k)]);
                self.op("neg.f32", vec![R(k), R(k)]);
                let r = f(self);
                self.op("fma.rn.f32", vec![R(r), R(k), F32(TWO_PI_HI), R(x)]);
                self.op("fma.rn.f32", vec![R(r), R(k), F32(TWO_PI_LO), R(r)]);
                let y = f(self);
                self.op(if op == UnOp::Sin { "sin.approx.f32" } else { "cos.approx.f32" }, vec![R(y), R(r)]);
                y
            }
            UnOp::Erf => {
                // erf(x) = sign(x)·(1 − t·P(t)·exp(−x²)), t = 1 / (1 + p·|x|)
                let f = |lw: &mut Self| lw.reg(RegClass::F32, "erf");
                let ax = one(self, "abs.f32");
                let d = f(self);
                self.op("fma.rn.f32", vec![R(d), R(ax), F32(0.327_591_1), F32(1.0)]);
                let t = f(self);
                self.op("rcp.rn.f32", vec![R(t), R(d)]);
                let mut p = f(self);
                self.op("mov.f32", vec![R(p), F32(1.061_405_4)]);
                for c in [-1.453_152_1f32, 1.421_413_8, -0.284_496_74, 0.254_829_6] {
                    let q = f(self);
                    self.op("fma.rn.f32", vec![R(q), R(p), R(t), F32(c)]);
                    p = q;
                }
                let pt = f(self);
                self.op("mul.f32", vec![R(pt), R(p), R(t)]);
                let sq = f(self);
                self.op("mul.f32", vec![R(sq), R(ax), R(ax)]);
                self.op("mul.f32", vec![R(sq), R(sq), F32(-std::f32::consts::LOG2_E)]);
                let e = f(self);
                self.op("ex2.approx.f32", vec![R(e), R(sq)]);
                let y = f(self);
                // y = 1 − pt·e
                self.op("neg.f32", vec![R(pt), R(pt)]);
                self.op("fma.rn.f32", vec![R(y), R(pt), R(e), F32(1.0)]);
                let r = f(self);
                self.op("copysign.f32", vec![R(r), R(x), R(y)]);
                r
            }
            UnOp::Not => unreachable!("verified TIR-H: `!` takes a bool"),
        }
    }
}

/// The value of an expression of literals alone (an unrolled loop's guard, `0 < 128 * 64 /
/// 4096`), as [`fold`] computes it; `None` where it names anything (a variable bound to a
/// constant included: such a branch stays a branch).
pub(crate) fn literal_value(e: &Expr) -> Option<i64> {
    match &e.kind {
        ExprKind::Int(v) => Some(*v),
        ExprKind::Bool(b) => Some(i64::from(*b)),
        ExprKind::Unary(UnOp::Not, a) => Some(i64::from(literal_value(a)? == 0)),
        // `false && x`, `x || true` and the like fold whatever `x` is (scalar expressions
        // have no effects): a constant knob's guard in front of a run-time test.
        ExprKind::Binary(op @ (BinOp::And | BinOp::Or), a, b)
            if [a, b].iter().any(|e| literal_value(e).is_some_and(|v| (v != 0) == matches!(op, BinOp::Or))) =>
        {
            Some(i64::from(matches!(op, BinOp::Or)))
        }
        ExprKind::Binary(op, a, b) => {
            let Type::Scalar(t) = a.checked_ty() else { return None };
            fold(*op, t, literal_value(a)?, literal_value(b)?)
        }
        _ => None,
    }
}

/// `a op b` on two constants of type `t` (a `bool` as 0 or 1), as the GPU computes it:
/// `i32` wrapping, division truncating toward zero; `None` where the GPU's answer is not
/// defined (division by zero, overflow) or `t` is `f32`.
fn fold(op: BinOp, t: ScalarType, a: i64, b: i64) -> Option<i64> {
    let cmp = |c: bool| Some(i64::from(c));
    match (op, t) {
        (BinOp::And, ScalarType::Bool) => return cmp(a != 0 && b != 0),
        (BinOp::Or, ScalarType::Bool) => return cmp(a != 0 || b != 0),
        (_, ScalarType::I32) => {}
        _ => return None,
    }
    let (a, b) = (i32::try_from(a).ok()?, i32::try_from(b).ok()?);
    let v = match op {
        BinOp::Lt => return cmp(a < b),
        BinOp::Le => return cmp(a <= b),
        BinOp::Gt => return cmp(a > b),
        BinOp::Ge => return cmp(a >= b),
        BinOp::Eq => return cmp(a == b),
        BinOp::Ne => return cmp(a != b),
        BinOp::Add => a.wrapping_add(b),
        BinOp::Sub => a.wrapping_sub(b),
        BinOp::Mul => a.wrapping_mul(b),
        BinOp::Div => a.checked_div(b)?,
        BinOp::Rem => a.checked_rem(b)?,
        BinOp::Max => a.max(b),
        BinOp::Min => a.min(b),
        _ => return None,
    };
    Some(i64::from(v))
}

/// The PTX instruction for a binary operator on scalars of type `t`.
pub(crate) fn scalar_binop(op: BinOp, t: ScalarType) -> String {
    let ty = match t {
        ScalarType::F32 => "f32",
        ScalarType::I32 => "s32",
        ScalarType::Bool => "pred",
    };
    let name = match (op, t) {
        (BinOp::Add, _) => "add",
        (BinOp::Sub, _) => "sub",
        (BinOp::Mul, ScalarType::I32) => "mul.lo",
        (BinOp::Mul, _) => "mul",
        (BinOp::Div, ScalarType::F32) => "div.rn",
        (BinOp::Div, _) => "div",
        (BinOp::Rem, _) => "rem",
        (BinOp::Max, _) => "max",
        (BinOp::Min, _) => "min",
        (BinOp::And, _) => "and",
        (BinOp::Or, _) => "or",
        (BinOp::Lt, _) => "setp.lt",
        (BinOp::Le, _) => "setp.le",
        (BinOp::Gt, _) => "setp.gt",
        (BinOp::Ge, _) => "setp.ge",
        (BinOp::Eq, _) => "setp.eq",
        (BinOp::Ne, _) => "setp.ne",
    };
    format!("{name}.{ty}")
}

#[cfg(test)]
mod tests {
    use super::fold;
    use crate::dtype::ScalarType;
    use crate::tirh::BinOp;

    fn fold_i32(op: BinOp, a: i64, b: i64) -> Option<i64> {
        fold(op, ScalarType::I32, a, b)
    }

    #[test]
    fn constants_fold_as_the_gpu_computes_them() {
        assert_eq!(fold_i32(BinOp::Div, 128, 32), Some(4));
        assert_eq!(fold_i32(BinOp::Div, -7, 2), Some(-3));
        assert_eq!(fold_i32(BinOp::Rem, -7, 2), Some(-1));
        assert_eq!(fold_i32(BinOp::Mul, 1 << 30, 4), Some(0));
        assert_eq!(fold_i32(BinOp::Min, 3, -5), Some(-5));
        // Left to the GPU: no defined answer to fold to.
        assert_eq!(fold_i32(BinOp::Div, 1, 0), None);
        assert_eq!(fold_i32(BinOp::Div, i64::from(i32::MIN), -1), None);
        assert_eq!(fold_i32(BinOp::Lt, 1, 2), Some(1));
        assert_eq!(fold_i32(BinOp::Eq, 64, 128), Some(0));
        assert_eq!(fold(BinOp::And, ScalarType::Bool, 1, 0), Some(0));
        assert_eq!(fold(BinOp::Add, ScalarType::F32, 1, 2), None);
    }
}
