//! Values of the interpreter and the arithmetic on them, rounding as the GPU's lowering does:
//! tile elements are held in their dtype and computed in f32 (`cvt.rn` back to bf16/f16).

use super::View;
use half::{bf16, f16};
use tessera_ptx::tirh::{BinOp, ReduceOp, ScanStep, TileType, UnOp};
use tessera_ptx::DType;

/// A value bound to a name.
#[derive(Clone, Debug)]
pub(crate) enum Val {
    I(i32),
    F(f32),
    B(bool),
    T(Tile),
    Ring(usize),
    View(View),
    Pipe(usize),
    Global(usize),
}

/// Which entries of a tile were computed from shared memory nothing wrote, and where that
/// was read.
#[derive(Clone, Debug)]
pub(crate) struct Poison {
    pub mask: Vec<bool>,
    pub what: String,
}

/// A register tile: row-major elements, each already rounded to the dtype (an `i32` tile
/// keeps its bits in an f32, as the GPU's registers do).
#[derive(Clone, Debug)]
pub(crate) struct Tile {
    pub ty: TileType,
    pub v: Vec<f32>,
    pub poison: Option<Box<Poison>>,
}

/// Rounds an f32 to `dtype` (to nearest even; beyond a 16-bit range to infinity, beyond an
/// fp8 range to its largest finite value, as the GPU's saturating `cvt`).
pub(crate) fn round(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::BF16 => bf16::from_f32(x).to_f32(),
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::F32 | DType::I32 => x,
        DType::F8E4M3 | DType::F8E5M2 => crate::fp8::round(dtype, x).unwrap_or(x),
    }
}

/// A scalar as an element of a `dtype` tile.
pub(crate) fn element_of(v: &Val, dtype: DType) -> f32 {
    match (v, dtype) {
        (Val::I(i), DType::I32) => f32::from_bits(*i as u32),
        (Val::I(i), d) => round(d, *i as f32),
        (Val::F(x), DType::I32) => f32::from_bits(*x as i32 as u32),
        (Val::F(x), d) => round(d, *x),
        _ => 0.0,
    }
}

/// Element `i` of a buffer of `dtype`, widened to f32 (an i32's bits kept).
pub(crate) fn read(bytes: &[u8], dtype: DType, i: usize) -> f32 {
    let n = dtype.size() as usize;
    let b = &bytes[i * n..(i + 1) * n];
    match dtype {
        DType::F32 | DType::I32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        DType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
        DType::F8E4M3 | DType::F8E5M2 => crate::fp8::decode(dtype, b[0]).unwrap_or(0.0),
    }
}

/// Writes element `i` of a buffer of `dtype`.
pub(crate) fn write(bytes: &mut [u8], dtype: DType, i: usize, x: f32) {
    let n = dtype.size() as usize;
    let b = &mut bytes[i * n..(i + 1) * n];
    match dtype {
        DType::F32 | DType::I32 => b.copy_from_slice(&x.to_le_bytes()),
        DType::BF16 => b.copy_from_slice(&bf16::from_f32(x).to_le_bytes()),
        DType::F16 => b.copy_from_slice(&f16::from_f32(x).to_le_bytes()),
        DType::F8E4M3 | DType::F8E5M2 => b[0] = crate::fp8::encode(dtype, x).unwrap_or(0),
    }
}

impl Tile {
    pub fn full(ty: TileType, x: f32) -> Tile {
        Tile { ty, v: vec![x; (ty.rows * ty.cols) as usize], poison: None }
    }

    pub fn poisoned(&self, i: usize) -> bool {
        self.poison.as_ref().is_some_and(|p| p.mask[i])
    }

    pub fn merge_poison(&mut self, p: Poison) {
        match &mut self.poison {
            Some(mine) => mine.mask.iter_mut().zip(&p.mask).for_each(|(a, b)| *a |= *b),
            None => self.poison = Some(Box::new(p)),
        }
    }

    fn map(mut self, f: impl Fn(f32) -> f32) -> Tile {
        let d = self.ty.dtype;
        self.v.iter_mut().for_each(|x| *x = round(d, f(*x)));
        self
    }

    /// Element `j` along `axis` (1: of each row, 0: of each column) takes element `j − by`
    /// (`j + by`, `reverse`); the first (last) `by` take `fill`.
    pub fn shift(&self, axis: u32, by: u32, reverse: bool, fill: f32) -> Tile {
        let (rows, cols) = (self.ty.rows as usize, self.ty.cols as usize);
        let by = by as usize;
        self.gather(fill, |i| {
            let (r, c) = (i / cols, i % cols);
            match (axis, reverse) {
                (1, false) if c >= by => Some(r * cols + c - by),
                (0, false) if r >= by => Some((r - by) * cols + c),
                (1, true) if c + by < cols => Some(r * cols + c + by),
                (0, true) if r + by < rows => Some((r + by) * cols + c),
                _ => None,
            }
        })
    }

    /// [`Self::shift`] with the elements shifted in taken from `from` (a tile of the same type)
    /// instead of a fill: the window of `[from | self]` (`[self | from]` with `reverse`) `by`
    /// before (after) `self` along `axis` — a funnel shift.
    pub fn shift_from(&self, axis: u32, by: u32, reverse: bool, from: &Tile) -> Tile {
        let (rows, cols) = (self.ty.rows as usize, self.ty.cols as usize);
        let (n, by) = (if axis == 1 { cols } else { rows }, by as usize);
        let step = if axis == 1 { 1 } else { cols };
        // Element i's index along the axis, and where its source lies: (in self?, index).
        let src = |i: usize| {
            let at = if axis == 1 { i % cols } else { i / cols };
            let base = i - at * step;
            match reverse {
                false if at >= by => (true, base + (at - by) * step),
                false => (false, base + (n + at - by) * step),
                true if at + by < n => (true, base + (at + by) * step),
                true => (false, base + (at + by - n) * step),
            }
        };
        let pick = |i: usize| {
            let (mine, j) = src(i);
            if mine {
                (self.v[j], self.poisoned(j))
            } else {
                (from.v[j], from.poisoned(j))
            }
        };
        let v = (0..rows * cols).map(|i| pick(i).0).collect();
        let poison = (self.poison.is_some() || from.poison.is_some()).then(|| {
            let what = self.poison.as_ref().or(from.poison.as_ref()).map(|p| p.what.clone()).unwrap_or_default();
            Box::new(Poison { mask: (0..rows * cols).map(|i| pick(i).1).collect(), what })
        });
        Tile { ty: self.ty, v, poison }
    }

    /// A scan step's operand: each element the step touches takes the column it combines with
    /// in its row, `fill` where none (and where the step leaves the element alone).
    pub fn scan_part(&self, step: ScanStep, fill: f32) -> Tile {
        let cols = self.ty.cols as usize;
        self.gather(fill, |i| step.source((i % cols) as u32).map(|c| i / cols * cols + c as usize))
    }

    /// After a scan step: `self` (the combine's result) where the step touches an element,
    /// `old` elsewhere.
    pub fn scan_pick(&self, old: &Tile, step: ScanStep) -> Tile {
        let cols = self.ty.cols as usize;
        let from = |i: usize| if step.touches((i % cols) as u32) { self } else { old };
        let n = self.v.len();
        let poison = (self.poison.is_some() || old.poison.is_some()).then(|| {
            let what = self.poison.as_ref().or(old.poison.as_ref()).map(|p| p.what.clone()).unwrap_or_default();
            Box::new(Poison { mask: (0..n).map(|i| from(i).poisoned(i)).collect(), what })
        });
        Tile { ty: self.ty, v: (0..n).map(|i| from(i).v[i]).collect(), poison }
    }

    /// Element `i` from element `src(i)`, or `fill` where that is `None`.
    fn gather(&self, fill: f32, src: impl Fn(usize) -> Option<usize>) -> Tile {
        let (rows, cols) = (self.ty.rows as usize, self.ty.cols as usize);
        let v = (0..rows * cols).map(|i| src(i).map_or(fill, |j| self.v[j])).collect();
        let poison = self.poison.as_ref().map(|p| {
            let mut q = p.as_ref().clone();
            q.mask = (0..rows * cols).map(|i| src(i).is_some_and(|j| p.mask[j])).collect();
            Box::new(q)
        });
        Tile { ty: self.ty, v, poison }
    }

    /// Columns `start..start + cols`.
    pub fn cols(&self, start: u32, cols: u32) -> Tile {
        let (w, rows) = (self.ty.cols as usize, self.ty.rows as usize);
        let pick = |i: usize| (i / cols as usize) * w + start as usize + i % cols as usize;
        let n = rows * cols as usize;
        Tile {
            ty: TileType { cols, ..self.ty },
            v: (0..n).map(|i| self.v[pick(i)]).collect(),
            poison: self
                .poison
                .as_ref()
                .map(|p| Box::new(Poison { mask: (0..n).map(|i| p.mask[pick(i)]).collect(), what: p.what.clone() })),
        }
    }

    /// Combines tiles of one type elementwise, in order (`block_sum` over warpgroups).
    pub fn combine(parts: &[Tile], op: ReduceOp) -> Tile {
        let mut out = parts[0].clone();
        for p in &parts[1..] {
            for (a, &b) in out.v.iter_mut().zip(&p.v) {
                *a = round(
                    out.ty.dtype,
                    match op {
                        ReduceOp::Sum => *a + b,
                        ReduceOp::Max => a.max(b),
                        ReduceOp::Min => a.min(b),
                    },
                );
            }
            if let Some(q) = &p.poison {
                out.merge_poison((**q).clone());
            }
        }
        out
    }

    /// Reduces `axis` (0: down the rows, 1: along each row) to extent 1, in f32.
    pub fn reduce(&self, op: ReduceOp, axis: u32) -> Tile {
        let (rows, cols) = (self.ty.rows as usize, self.ty.cols as usize);
        let (outer, inner) = if axis == 1 { (rows, cols) } else { (cols, rows) };
        let at = |o: usize, i: usize| if axis == 1 { o * cols + i } else { i * cols + o };
        let combine = |a: f32, b: f32| match op {
            ReduceOp::Sum => a + b,
            ReduceOp::Max => a.max(b),
            ReduceOp::Min => a.min(b),
        };
        let v =
            (0..outer).map(|o| round(self.ty.dtype, (1..inner).fold(self.v[at(o, 0)], |acc, i| combine(acc, self.v[at(o, i)])))).collect();
        let ty = if axis == 1 { TileType { cols: 1, ..self.ty } } else { TileType { rows: 1, ..self.ty } };
        let poison = self
            .poison
            .as_ref()
            .map(|p| Box::new(Poison { mask: (0..outer).map(|o| (0..inner).any(|i| p.mask[at(o, i)])).collect(), what: p.what.clone() }));
        Tile { ty, v, poison }
    }
}

/// `x.cast::<to>()` / `x as to`.
pub(crate) fn cast(v: Val, to: DType) -> Result<Val, String> {
    Ok(match (v, to) {
        (Val::T(mut t), _) => {
            t.ty.dtype = to;
            t.v.iter_mut().for_each(|x| *x = round(to, *x));
            Val::T(t)
        }
        // cvt.rn.f32.s32 and cvt.rzi.s32.f32 (saturating, NaN to 0).
        (Val::I(i), DType::F32) => Val::F(i as f32),
        (Val::F(x), DType::I32) => Val::I(x as i32),
        (v @ (Val::I(_) | Val::F(_)), _) => v,
        (v, _) => return Err(format!("cannot cast {v:?}")),
    })
}

/// The erf of the lowering (Abramowitz–Stegun 7.1.26), step for step.
fn erf(x: f32) -> f32 {
    let ax = x.abs();
    let t = 1.0 / ax.mul_add(0.327_591_1, 1.0);
    let mut p = 1.061_405_4f32;
    for c in [-1.453_152_1f32, 1.421_413_8, -0.284_496_74, 0.254_829_6] {
        p = p.mul_add(t, c);
    }
    let e = ((ax * ax) * -std::f32::consts::LOG2_E).exp2();
    (-(p * t)).mul_add(e, 1.0).copysign(x)
}

/// `exp2_fma` as the lowering computes it, operation for operation (the same bits).
fn exp2_fma(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    let t = x.clamp(-127.0, 127.0);
    let r = t + MAGIC;
    let f = t - (r - MAGIC);
    let [c0, c1, c2, c3, c4, c5] = tessera_ptx::lower::EXP2_POLY;
    let p = c5.mul_add(f, c4).mul_add(f, c3).mul_add(f, c2).mul_add(f, c1).mul_add(f, c0);
    if x >= -126.5 {
        f32::from_bits(p.to_bits().wrapping_add(r.to_bits() << 23))
    } else {
        0.0
    }
}

fn f32_unary(op: UnOp, x: f32) -> f32 {
    match op {
        UnOp::Neg => -x,
        // As the GPU's ex2.approx.ftz: results below the smallest normal flush to 0.
        UnOp::Exp2Fma => exp2_fma(x),
        // (Which elements the GPU computes by the polynomial depends on its registers: here all
        // by the exact function, within the polynomial's 2.2·10⁻⁷ of it.)
        UnOp::Exp2 | UnOp::Exp2Split => {
            let y = x.exp2();
            if y < f32::MIN_POSITIVE {
                0.0
            } else {
                y
            }
        }
        UnOp::Log2 => x.log2(),
        UnOp::Abs => x.abs(),
        UnOp::Sqrt => x.sqrt(),
        UnOp::Rsqrt => 1.0 / x.sqrt(),
        UnOp::Tanh => x.tanh(),
        UnOp::Erf => erf(x),
        UnOp::Sin | UnOp::SinReduced => x.sin(),
        UnOp::Cos | UnOp::CosReduced => x.cos(),
        UnOp::Floor => x.floor(),
        UnOp::Step => {
            if x >= 0.0 {
                1.0
            } else {
                0.0
            }
        }
        UnOp::Not => x,
    }
}

/// The widest argument `sin_reduced`/`cos_reduced` take: π and a little for the rounding of
/// an angle computed in f32 (the hardware's error stays near its bound there).
const REDUCED_MAX: f32 = std::f32::consts::PI * 1.001;

pub(crate) fn unary(op: UnOp, v: Val) -> Result<Val, String> {
    if matches!(op, UnOp::SinReduced | UnOp::CosReduced) {
        let past = match &v {
            Val::F(x) => (x.abs() > REDUCED_MAX).then_some(*x),
            Val::T(t) => t.v.iter().copied().find(|x| x.abs() > REDUCED_MAX),
            _ => None,
        };
        if let Some(x) = past {
            return Err(format!(
                "`{}` takes arguments in [−π, π] (the hardware's approximation without range reduction), found {x}: use `{}`",
                op.name(),
                if op == UnOp::SinReduced { "sin" } else { "cos" }
            ));
        }
    }
    Ok(match (op, v) {
        (UnOp::Not, Val::B(b)) => Val::B(!b),
        (UnOp::Neg, Val::I(i)) => Val::I(i.wrapping_neg()),
        (op, Val::F(x)) => Val::F(f32_unary(op, x)),
        (op, Val::T(t)) => Val::T(t.map(|x| f32_unary(op, x))),
        (op, v) => return Err(format!("`{}` of {v:?}", op.name())),
    })
}

fn f32_binary(op: BinOp, a: f32, b: f32) -> f32 {
    match op {
        BinOp::Add => a + b,
        BinOp::Sub => a - b,
        BinOp::Mul => a * b,
        BinOp::Div => a / b,
        BinOp::Max => a.max(b),
        BinOp::Min => a.min(b),
        _ => f32::NAN,
    }
}

/// A comparison (`setp`; false when a float operand is NaN, except `!=`).
fn compare<T: PartialOrd>(op: BinOp, a: T, b: T) -> bool {
    match op {
        BinOp::Lt => a < b,
        BinOp::Le => a <= b,
        BinOp::Gt => a > b,
        BinOp::Ge => a >= b,
        BinOp::Eq => a == b,
        _ => a != b,
    }
}

pub(crate) fn binary(op: BinOp, x: Val, y: Val) -> Result<Val, String> {
    use BinOp as O;
    Ok(match (x, y) {
        (Val::I(a), Val::I(b)) => match op {
            O::Add => Val::I(a.wrapping_add(b)),
            O::Sub => Val::I(a.wrapping_sub(b)),
            O::Mul => Val::I(a.wrapping_mul(b)),
            O::Div | O::Rem if b == 0 => return Err(format!("integer division by zero ({a} {} 0)", op.symbol())),
            O::Div => Val::I(a.wrapping_div(b)),
            O::Rem => Val::I(a.wrapping_rem(b)),
            O::Max => Val::I(a.max(b)),
            O::Min => Val::I(a.min(b)),
            O::And | O::Or => return Err(format!("`{}` of integers", op.symbol())),
            _ => Val::B(compare(op, a, b)),
        },
        (Val::F(a), Val::F(b)) => match op {
            O::Rem | O::And | O::Or => return Err(format!("`{}` of floats", op.symbol())),
            _ if op.is_comparison() => Val::B(compare(op, a, b)),
            _ => Val::F(f32_binary(op, a, b)),
        },
        (Val::B(a), Val::B(b)) => match op {
            O::And => Val::B(a && b),
            O::Or => Val::B(a || b),
            _ => return Err(format!("`{}` of bools", op.symbol())),
        },
        (Val::T(t), Val::F(s)) => Val::T(t.map(|x| f32_binary(op, x, s))),
        (Val::F(s), Val::T(t)) => Val::T(t.map(|x| f32_binary(op, s, x))),
        (Val::T(a), Val::T(b)) => Val::T(tile_binary(op, &a, &b)),
        (x, y) => return Err(format!("`{}` of {x:?} and {y:?}", op.symbol())),
    })
}

/// Elementwise `a op b`, an `M×1` or `1×N` operand broadcasting.
fn tile_binary(op: BinOp, a: &Tile, b: &Tile) -> Tile {
    let rows = a.ty.rows.max(b.ty.rows) as usize;
    let cols = a.ty.cols.max(b.ty.cols) as usize;
    let at = |t: &Tile, r: usize, c: usize| (if t.ty.rows == 1 { 0 } else { r }) * t.ty.cols as usize + if t.ty.cols == 1 { 0 } else { c };
    let d = a.ty.dtype;
    let mut v = Vec::with_capacity(rows * cols);
    let mut mask = (a.poison.is_some() || b.poison.is_some()).then(|| Vec::with_capacity(rows * cols));
    for r in 0..rows {
        for c in 0..cols {
            let (i, j) = (at(a, r, c), at(b, r, c));
            v.push(round(d, f32_binary(op, a.v[i], b.v[j])));
            if let Some(m) = &mut mask {
                m.push(a.poisoned(i) || b.poisoned(j));
            }
        }
    }
    let what = a.poison.as_ref().or(b.poison.as_ref()).map(|p| p.what.clone()).unwrap_or_default();
    Tile { ty: TileType { dtype: d, rows: rows as u32, cols: cols as u32 }, v, poison: mask.map(|mask| Box::new(Poison { mask, what })) }
}

/// `x·y + z` (or `x·y − z`, `z − x·y`) on f32 values with one rounding, as ptxas contracts
/// `mul.f32` and `add.f32` into `fma.rn.f32`. Tiles broadcast as in [`binary`].
pub(crate) fn fused(op: BinOp, product_left: bool, x: Val, y: Val, z: Val) -> Result<Val, String> {
    let f = |a: f32, b: f32, c: f32| -> f32 {
        let p = f64::from(a) * f64::from(b);
        let c = f64::from(c);
        (match (op, product_left) {
            (BinOp::Sub, true) => p - c,
            (BinOp::Sub, false) => c - p,
            _ => p + c,
        }) as f32
    };
    let tiles: Vec<&Tile> = [&x, &y, &z].into_iter().filter_map(|v| if let Val::T(t) = v { Some(t) } else { None }).collect();
    if tiles.is_empty() {
        return match (x, y, z) {
            (Val::F(a), Val::F(b), Val::F(c)) => Ok(Val::F(f(a, b, c))),
            (x, y, z) => Err(format!("fused multiply-add of {x:?}, {y:?}, {z:?}")),
        };
    }
    let rows = tiles.iter().map(|t| t.ty.rows).max().unwrap_or(1);
    let cols = tiles.iter().map(|t| t.ty.cols).max().unwrap_or(1);
    let dtype = tiles[0].ty.dtype;
    let what = tiles.iter().find_map(|t| t.poison.as_ref().map(|p| p.what.clone()));
    let at = |v: &Val, r: u32, c: u32| -> (f32, bool) {
        match v {
            Val::T(t) => {
                let i = ((if t.ty.rows == 1 { 0 } else { r }) * t.ty.cols + if t.ty.cols == 1 { 0 } else { c }) as usize;
                (t.v[i], t.poisoned(i))
            }
            Val::F(s) => (*s, false),
            _ => (f32::NAN, false),
        }
    };
    let n = (rows * cols) as usize;
    let (mut v, mut mask) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for r in 0..rows {
        for c in 0..cols {
            let ((a, pa), (b, pb), (d, pd)) = (at(&x, r, c), at(&y, r, c), at(&z, r, c));
            v.push(round(dtype, f(a, b, d)));
            mask.push(pa || pb || pd);
        }
    }
    Ok(Val::T(Tile { ty: TileType { dtype, rows, cols }, v, poison: what.map(|what| Box::new(Poison { mask, what })) }))
}
