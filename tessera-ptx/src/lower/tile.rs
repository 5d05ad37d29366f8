//! Tile expressions: constructors, elementwise math with broadcasting, casts, reductions and
//! layout conversions through shared memory.

use super::{elem_class, Lowerer, TileVal};
use crate::dtype::DType;
use crate::error::CompileError;
use crate::layout::{Layout, LayoutKind};
use crate::tirh::{BinOp, Expr, ExprKind, ReduceOp, ScanKind, ScanStep, TileType, Type, UnOp, UniformKind};
use crate::tirt::{Operand, Reg, RegClass};

impl Lowerer<'_> {
    /// Lowers a tile expression.
    pub(crate) fn tile(&mut self, e: &Expr) -> Result<TileVal, CompileError> {
        let Type::Tile(ty) = e.checked_ty() else { unreachable!("verified TIR-H: a tile") };
        if matches!(e.kind, ExprKind::Binary(..) | ExprKind::Unary(..)) && ty.dtype == DType::F32 && per_element(e, &self.deferred) {
            let layout = self.hinted_layout(ty);
            return Ok(self.index_tile(e, ty, layout));
        }
        Ok(match &e.kind {
            ExprKind::Var(n) => match self.lookup(n) {
                super::Value::Tile(t) => {
                    // An index tile needed in a layout it would move into through shared
                    // memory: computed again in that one.
                    let again = match (self.layout_hint, self.deferred.iter().rev().find(|(d, _)| d == n)) {
                        (Some(h), Some((_, value)))
                            if h.rows == ty.rows && h.cols == ty.cols && h != t.layout && t.layout.local_map(&h).is_none() =>
                        {
                            Some(value.clone())
                        }
                        _ => None,
                    };
                    if let Some(value) = again {
                        return self.tile(&std::rc::Rc::clone(&value));
                    }
                    self.before_tile_read(&t);
                    t
                }
                _ => unreachable!("verified TIR-H: `{n}` is a tile"),
            },
            ExprKind::Full { .. } => {
                let layout = self.hinted_layout(ty);
                self.full(e, ty, layout)?
            }
            ExprKind::Iota { axis, .. } => {
                let layout = self.hinted_layout(ty);
                self.iota(ty, layout, *axis)
            }
            ExprKind::Uniform { kind, seed, origin, .. } => {
                let layout = self.hinted_layout(ty);
                match *kind {
                    UniformKind::Words => self.uniform(ty, layout, seed, origin)?,
                    UniformKind::Bytes { transposed } => self.uniform8(ty, layout, transposed, seed, origin)?,
                }
            }
            ExprKind::SwapPairs(value) => {
                let t = self.tile(value)?;
                swap_pairs(t)
            }
            ExprKind::SmemLoad(view) => {
                let layout = self.hinted_layout(ty);
                self.smem_load(view, ty, layout)?
            }
            ExprKind::EdgeCol { value, last } => {
                let t = self.tile(value)?;
                self.edge_col(t, *last)
            }
            ExprKind::Shift { value, axis, by, reverse, fill } if matches!(fill.ty, Some(crate::tirh::Type::Tile(_))) => {
                let t = self.tile(value)?;
                let from = self.tile(fill)?;
                self.funnel(t, from, *axis, *by, *reverse)
            }
            ExprKind::Shift { value, axis, by, reverse, fill } => {
                let t = self.tile(value)?;
                let f = self.scalar(fill)?;
                let f = self.in_reg(f, crate::dtype::ScalarType::F32, "fill");
                self.shift(t, *axis, *by, *reverse, f)
            }
            ExprKind::ScanPart { value, step, fill } => {
                let t = self.tile(value)?;
                let f = self.scalar(fill)?;
                let f = self.in_reg(f, crate::dtype::ScalarType::F32, "fill");
                self.scan_part(t, *step, f)
            }
            ExprKind::ScanPick { updated, old, step } => {
                let u = self.tile(updated)?;
                let o = self.tile(old)?;
                self.scan_pick(u, o, *step)
            }

            ExprKind::Load { .. } => {
                let (g, idx, ty, fill, layout) = self.load_args(e)?;
                self.load(&g, &idx, ty, fill, layout)
            }
            ExprKind::LoadFragments { tensor, index, tile } => {
                // Each thread's registers four at a time from `((i / 4)·128 + t)·16` bytes on
                // (as `store_fragments` left them): a warp's 512 bytes contiguous.
                let g = self.global(tensor);
                let idx = index.iter().map(|i| self.scalar(i)).collect::<Result<Vec<_>, _>>()?;
                let layout = Layout::wgmma(tile.rows, tile.cols);
                let regs: Vec<Reg> = (0..layout.len()).map(|_| self.reg(RegClass::F32, "frag")).collect();
                let nc = if g.written { "" } else { ".nc" };
                let (addr, room, ok) = self.flat_address(&g, &idx, Some(16));
                for (j, quad) in regs.chunks(4).enumerate() {
                    let ok = self.flat_fits(room, ok, j as u32 * 2048 + 16);
                    for r in quad {
                        self.op("mov.f32", vec![Operand::Reg(*r), Operand::F32(0.0)]);
                    }
                    let names = quad.iter().map(|r| self.reg_name(*r)).collect::<Vec<_>>().join(", ");
                    self.op_if(
                        ok,
                        false,
                        &format!("ld.global{nc}.v4.f32"),
                        vec![Operand::Sym(format!("{{{names}}}")), Operand::Addr(addr, (j * 2048) as i64)],
                    );
                }
                TileVal { ty: *tile, layout, regs }
            }
            ExprKind::Cast { value, to } => {
                let t = self.tile(value)?;
                self.cast(t, *to)
            }
            ExprKind::Unary(op, a) => {
                let t = self.tile(a)?;
                // `exp2_split`: every other register by the MUFU, the others by the FMA pipe.
                let mut n = 0;
                self.map_f32(&t, "u", |lw, x| {
                    n += 1;
                    let op = match op {
                        UnOp::Exp2Split if n % 2 == 0 => UnOp::Exp2Fma,
                        _ => *op,
                    };
                    lw.f32_unary(op, x)
                })
            }
            ExprKind::Binary(op, a, b) => self.binary(*op, a, b, ty)?,
            ExprKind::Reduce { op, axis, value } => {
                let t = self.tile(value)?;
                self.reduce(t, *op, *axis)
            }
            ExprKind::BlockReduce { op, value } => {
                let t = self.tile(value)?;
                self.block_reduce(t, *op)
            }
            ExprKind::MaskCols { value, limit, fill } => {
                let t = self.tile(value)?;
                self.mask_cols(t, limit, fill)?
            }
            ExprKind::KeepWhere { value, cond, fill } => self.keep_where(value, cond, fill, ty)?,
            ExprKind::TileCols { value, start, cols } => {
                let t = self.tile(value)?;
                let whole_rows = |l: Layout| matches!(l.kind, LayoutKind::Blocked { tc: 1, wc: 1, .. }) && l.keep_rows && l.keep_cols;
                let part = Layout::blocked(t.ty.rows, *cols);
                if whole_rows(t.layout) && whole_rows(part) && t.layout.footprint_rows() == part.footprint_rows() {
                    // Each thread holds its rows whole (a `Tile<_, 128, 8>`): the columns are its own
                    // registers, in the same rows.
                    let slots = t.layout.slots();
                    let regs = part
                        .slots()
                        .iter()
                        .map(|p| {
                            let at = slots.iter().position(|s| s.dr == p.dr && s.dc == p.dc + *start);
                            t.regs[at.expect("a whole-row layout holds every column of its rows")]
                        })
                        .collect();
                    return Ok(TileVal { ty, layout: part, regs });
                }
                let LayoutKind::Wgmma { m_blocks } = t.layout.kind else {
                    return Err(CompileError::Lower {
                        message: "`cols` takes an MMA accumulator (a tile that `mma_sync` wrote) or a tile whose rows each lie in one thread (`Tile<_, 128, 8>`)".into(),
                        loc: e.loc,
                    });
                };
                if *cols % 8 != 0 {
                    return Err(CompileError::Lower {
                        message: format!("`cols` of an MMA accumulator takes a multiple of 8 columns, found {cols}"),
                        loc: e.loc,
                    });
                }
                // Block b's registers for columns [start, start + cols) are a contiguous run of
                // the m64nN fragment: 4 registers per 8 columns.
                let per_block = (t.ty.cols / 2) as usize;
                let (from, n) = ((*start / 2) as usize, (*cols / 2) as usize);
                let regs = (0..m_blocks as usize).flat_map(|b| t.regs[b * per_block + from..b * per_block + from + n].to_vec()).collect();
                TileVal { ty, layout: Layout::wgmma(t.ty.rows, *cols), regs }
            }
            _ => unreachable!("verified TIR-H: not a tile expression"),
        })
    }

    /// What a load expression loads: the tensor, the origin, the tile type, the fill and the
    /// layout.
    pub(crate) fn load_args(&mut self, e: &Expr) -> Result<(super::GlobalVal, Vec<Operand>, TileType, Operand, Layout), CompileError> {
        let (ExprKind::Load { tensor, index, fill, .. }, Type::Tile(ty)) = (&e.kind, e.checked_ty()) else {
            unreachable!("verified TIR-H: a load gives a tile")
        };
        let g = self.global(tensor);
        let idx = index.iter().map(|i| self.scalar(i)).collect::<Result<Vec<_>, _>>()?;
        let fill = match fill {
            Some(f) => self.scalar(f)?,
            None => Operand::F32(0.0),
        };
        let fill = self.elem_from_f32(fill, ty.dtype);
        let layout = self.hinted_layout(ty);
        Ok((g, idx, ty, fill, layout))
    }

    /// The layout for a tile whose layout is free (a load or a constructor): that of the tile
    /// in registers it feeds, if there is one, else the canonical blocked layout.
    /// A hint of another shape stays for the tile it was meant for (in `row − col_index()`,
    /// the vector comes first).
    fn hinted_layout(&mut self, ty: TileType) -> Layout {
        match self.layout_hint {
            Some(h) if h.rows == ty.rows && h.cols == ty.cols => {
                self.layout_hint = None;
                h
            }
            _ => Layout::blocked(ty.rows, ty.cols),
        }
    }

    /// `Tile::col_index()` (`axis` 1) or `row_index()` (0) in `layout`: each register holds its
    /// element's column (row) as an f32.
    fn iota(&mut self, ty: TileType, layout: Layout, axis: u32) -> TileVal {
        use Operand::{Imm, Reg as R};
        let lr = self.layout_regs(layout);
        let base = if axis == 1 { lr.col } else { lr.row };
        let regs = layout
            .slots()
            .iter()
            .map(|slot| {
                let i = self.reg(RegClass::B32, "iota");
                self.op("add.s32", vec![R(i), R(base), Imm(i64::from(if axis == 1 { slot.dc } else { slot.dr }))]);
                let f = self.reg(RegClass::F32, "iota");
                self.op("cvt.rn.f32.s32", vec![R(f), R(i)]);
                f
            })
            .collect();
        TileVal { ty, layout, regs }
    }

    /// An index tile ([`index_like`]) in `layout`, element by element: each element's value
    /// from its own row and column, every subexpression computed once for each row (column)
    /// it depends on — `qi − kj + c` is two row values, a column value per column and one
    /// subtraction and addition per element, interleaved, rather than three whole tiles.
    fn index_tile(&mut self, e: &Expr, ty: TileType, layout: Layout) -> TileVal {
        let lr = self.layout_regs(layout);
        let mut memo = IndexMemo::default();
        let regs = layout.slots().iter().map(|slot| self.index_elem(e, (lr.row, lr.col), (slot.dr, slot.dc), &mut memo)).collect();
        TileVal { ty, layout, regs }
    }

    /// `f(base, at, x, memo)` for each register `x` of `t`, with its thread's first row and
    /// column `base` and its offsets `at` from them: an index tile's elements computed one by
    /// one beside their use, sharing one memo.
    fn beside_index(&mut self, t: &TileVal, mut f: impl FnMut(&mut Self, (Reg, Reg), (u32, u32), Reg, &mut IndexMemo) -> Reg) -> Vec<Reg> {
        let lr = self.layout_regs(t.layout);
        let mut memo = IndexMemo::default();
        t.layout.slots().iter().zip(&t.regs).map(|(slot, &x)| f(self, (lr.row, lr.col), (slot.dr, slot.dc), x, &mut memo)).collect()
    }

    /// One element of the index tile `e` at row `base.0 + at.0`, column `base.1 + at.1`.
    fn index_elem(&mut self, e: &Expr, base: (Reg, Reg), at: (u32, u32), memo: &mut IndexMemo) -> Reg {
        use Operand::{Imm, Reg as R};
        let (by_row, by_col) = index_deps(e, &self.deferred);
        let key = (std::ptr::from_ref(e) as usize, if by_row { at.0 } else { u32::MAX }, if by_col { at.1 } else { u32::MAX });
        if let Some(&r) = memo.elems.get(&key) {
            return r;
        }
        let tile = |x: &Expr| matches!(x.checked_ty(), Type::Tile(_));
        // A sum of rows, columns and scalars: the rows' and scalars' part once a row, then one
        // addition an element.
        if let (ExprKind::Binary(..), Some(f)) = (&e.kind, affine(e, &self.deferred)) {
            // The value at the thread's first column of this row, then the column's offset as
            // an immediate: nothing the same in every block of a loop (that ptxas would hoist
            // and hold, a register a column).
            let p = self.index_row_part(e, base, at, memo);
            let r = if f.col == 0 || at.1 == 0 {
                p
            } else {
                let out = self.reg(RegClass::F32, "idx");
                self.op("add.f32", vec![R(out), R(p), Operand::F32((f.col * i64::from(at.1)) as f32)]);
                out
            };
            memo.elems.insert(key, r);
            return r;
        }
        let r = match &e.kind {
            ExprKind::Iota { axis, tile: t } => {
                let f = self.reg(RegClass::F32, "idx");
                let along = if *axis == 1 { t.cols } else { t.rows };
                if along == 1 {
                    self.op("mov.f32", vec![R(f), Operand::F32(0.0)]);
                } else {
                    let i = self.reg(RegClass::B32, "idx");
                    let (b, off) = if *axis == 1 { (base.1, at.1) } else { (base.0, at.0) };
                    self.op("add.s32", vec![R(i), R(b), Imm(i64::from(off))]);
                    self.op("cvt.rn.f32.s32", vec![R(f), R(i)]);
                }
                f
            }
            ExprKind::Var(n) => {
                // (Shared, not copied: its address keys the memo.)
                let value =
                    self.deferred.iter().rev().find(|(d, _)| d == n).map(|(_, v)| v.clone()).expect("index_like: a deferred index tile");
                self.index_elem(&value, base, at, memo)
            }
            ExprKind::Unary(op, x) => {
                let x = self.index_elem(x, base, at, memo);
                self.f32_unary(*op, x)
            }
            ExprKind::Binary(op, x, y) => {
                let inst = super::scalar::scalar_binop(*op, crate::dtype::ScalarType::F32);
                let mut operand = |lw: &mut Self, v: &Expr| -> Reg {
                    if tile(v) {
                        lw.index_elem(v, base, at, memo)
                    } else {
                        let k = std::ptr::from_ref(v) as usize;
                        if let Some(&r) = memo.scalars.get(&k) {
                            return r;
                        }
                        let s = lw.scalar(v).expect("index_like: a plain scalar lowers");
                        let r = lw.in_reg(s, crate::dtype::ScalarType::F32, "s");
                        memo.scalars.insert(k, r);
                        r
                    }
                };
                let (a, b) = (operand(self, x), operand(self, y));
                let out = self.reg(RegClass::F32, "idx");
                self.op(&inst, vec![R(out), R(a), R(b)]);
                out
            }
            _ => unreachable!("index_like: iota, deferred names, unary and binary operations"),
        };
        memo.elems.insert(key, r);
        r
    }

    /// Whether an element of the index tile `cond` is ≥ 0, as a predicate: for an [`affine`]
    /// one, its row part compared with the column's offset, no arithmetic.
    fn index_nonnegative(&mut self, cond: &Expr, base: (Reg, Reg), at: (u32, u32), memo: &mut IndexMemo) -> Reg {
        use Operand::Reg as R;
        let keep = self.reg(RegClass::Pred, "keep");
        if let Some(f) = affine(cond, &self.deferred) {
            // `p + c·dc ≥ 0` as `p ≥ −c·dc`: one comparison with an immediate an element.
            let p = self.index_row_part(cond, base, at, memo);
            self.op("setp.ge.f32", vec![R(keep), R(p), Operand::F32((-f.col * i64::from(at.1)) as f32)]);
        } else {
            let c = self.index_elem(cond, base, at, memo);
            self.op("setp.ge.f32", vec![R(keep), R(c), Operand::F32(0.0)]);
        }
        keep
    }

    /// An affine index tile's ([`affine`]) value at row `base.0 + at.0` and the thread's first
    /// column `base.1` (rows, scalars and that column summed), once for each row.
    fn index_row_part(&mut self, e: &Expr, base: (Reg, Reg), at: (u32, u32), memo: &mut IndexMemo) -> Reg {
        use Operand::Reg as R;
        let row_key = (std::ptr::from_ref(e) as usize, at.0);
        if let Some(&r) = memo.row_parts.get(&row_key) {
            return r;
        }
        let f = affine(e, &self.deferred).expect("an affine index tile");
        // Integers throughout (`q as f32 − k0 as f32 + …`, the row itself): summed as integers,
        // exactly — ptxas may hoist the sum of loop-invariant ones — and converted once.
        let ints: Option<Vec<(bool, &Expr)>> = f
            .scalars
            .iter()
            .map(|(neg, x)| match &x.kind {
                ExprKind::Cast { value, .. } if value.checked_ty() == Type::Scalar(crate::dtype::ScalarType::I32) => Some((*neg, &**value)),
                _ => None,
            })
            .collect();
        if let (Some(ints), -1..=1, -1..=1) = (ints, f.row, f.col) {
            let mut acc: Option<(Reg, bool)> = None;
            if f.row != 0 {
                let i = self.reg(RegClass::B32, "idx");
                self.op("add.s32", vec![R(i), R(base.0), Operand::Imm(i64::from(at.0))]);
                acc = Some((i, f.row < 0));
            }
            let col = (f.col != 0).then_some((base.1, f.col < 0));
            let terms: Vec<(bool, Reg)> = ints
                .into_iter()
                .map(|(neg, x)| {
                    let v = self.scalar(x).expect("index_like: a plain scalar lowers");
                    (neg, self.in_reg(v, crate::dtype::ScalarType::I32, "s"))
                })
                .chain(col.map(|(c, neg)| (neg, c)))
                .collect();
            for (neg, v) in terms {
                acc = Some(match acc {
                    None => (v, neg),
                    Some((a, a_neg)) => {
                        let out = self.reg(RegClass::B32, "idx");
                        // a_neg: the sum so far is negated.
                        let op = if neg == a_neg { "add.s32" } else { "sub.s32" };
                        self.op(op, vec![R(out), R(a), R(v)]);
                        (out, a_neg)
                    }
                });
            }
            let Some((i, neg)) = acc else {
                let r = self.reg(RegClass::F32, "idx");
                self.op("mov.f32", vec![R(r), Operand::F32(0.0)]);
                memo.row_parts.insert(row_key, r);
                return r;
            };
            let i = if neg {
                let n = self.reg(RegClass::B32, "idx");
                self.op("neg.s32", vec![R(n), R(i)]);
                n
            } else {
                i
            };
            let r = self.reg(RegClass::F32, "idx");
            self.op("cvt.rn.f32.s32", vec![R(r), R(i)]);
            memo.row_parts.insert(row_key, r);
            return r;
        }
        let mut acc: Option<Reg> = None;
        if f.row != 0 {
            let r = self.index_coord(base.0, at.0, &mut memo.rows);
            acc = Some(self.scaled(r, f.row));
        }
        if f.col != 0 {
            let c = self.index_coord(base.1, 0, &mut memo.cols);
            let c = self.scaled(c, f.col);
            acc = Some(match acc {
                Some(a) => {
                    let out = self.reg(RegClass::F32, "idx");
                    self.op("add.f32", vec![R(out), R(a), R(c)]);
                    out
                }
                None => c,
            });
        }
        for (neg, x) in &f.scalars {
            let v = self.scalar(x).expect("index_like: a plain scalar lowers");
            let v = self.in_reg(v, crate::dtype::ScalarType::F32, "s");
            let out = self.reg(RegClass::F32, "idx");
            match (acc, neg) {
                (Some(a), false) => self.op("add.f32", vec![R(out), R(a), R(v)]),
                (Some(a), true) => self.op("sub.f32", vec![R(out), R(a), R(v)]),
                (None, false) => self.op("mov.f32", vec![R(out), R(v)]),
                (None, true) => self.op("neg.f32", vec![R(out), R(v)]),
            }
            acc = Some(out);
        }
        let r = match acc {
            Some(r) => r,
            None => {
                let r = self.reg(RegClass::F32, "idx");
                self.op("mov.f32", vec![R(r), Operand::F32(0.0)]);
                r
            }
        };
        memo.row_parts.insert(row_key, r);
        r
    }

    /// A thread's row (column) `base + off` as an f32, once for each `off`.
    fn index_coord(&mut self, base: Reg, off: u32, memo: &mut std::collections::HashMap<u32, Reg>) -> Reg {
        if let Some(&r) = memo.get(&off) {
            return r;
        }
        let i = self.reg(RegClass::B32, "idx");
        self.op("add.s32", vec![Operand::Reg(i), Operand::Reg(base), Operand::Imm(i64::from(off))]);
        let f = self.reg(RegClass::F32, "idx");
        self.op("cvt.rn.f32.s32", vec![Operand::Reg(f), Operand::Reg(i)]);
        memo.insert(off, f);
        f
    }

    /// `c·x` (`x` itself for 1).
    fn scaled(&mut self, x: Reg, c: i64) -> Reg {
        if c == 1 {
            return x;
        }
        let out = self.reg(RegClass::F32, "idx");
        self.op("mul.f32", vec![Operand::Reg(out), Operand::Reg(x), Operand::F32(c as f32)]);
        out
    }

    /// `Tile::<f32, M, N>::uniform(seed_lo, seed_hi, offset, [row, col])` in `layout` (the
    /// numbers of [`crate::random`]). Where a thread holds its columns in aligned runs of 4
    /// (blocked layouts of 4 or 8 columns a run), one Philox call serves a run's four
    /// registers; elsewhere each register makes its own call and picks its word at run time.
    fn uniform(&mut self, ty: TileType, layout: Layout, seed: &[Expr], origin: &[Expr]) -> Result<TileVal, CompileError> {
        use Operand::{Imm, Reg as R};
        let args = self.rng_args(seed, origin)?;
        let [k0, k1, offset, row, col] = args[..] else { unreachable!("verified TIR-H: three seed words and two indices") };
        let lr = self.layout_regs(layout);
        // The counter's first two words before the slot's offsets: (col >> 2) + (thread col >> 2)
        // and row + thread row.
        let (c0_base, c1_base, col_q) = (self.reg(RegClass::B32, "ctr"), self.reg(RegClass::B32, "ctr"), self.reg(RegClass::B32, "ctr"));
        self.op("shr.u32", vec![R(col_q), R(col), Imm(2)]);
        self.op("add.u32", vec![R(c1_base), R(row), R(lr.row)]);
        let grouped = matches!(layout.kind, LayoutKind::Blocked { v, .. } if v.is_multiple_of(4))
            && (!layout.keep_cols || layout.parent_cols.is_multiple_of(4));
        if grouped {
            let tq = self.reg(RegClass::B32, "ctr");
            self.op("shr.u32", vec![R(tq), R(lr.col), Imm(2)]);
            self.op("add.u32", vec![R(c0_base), R(col_q), R(tq)]);
        }
        let slots = layout.slots();
        let mut regs = vec![None; slots.len()];
        for (i, s) in slots.iter().enumerate() {
            if regs[i].is_some() {
                continue;
            }
            let c1 = self.reg(RegClass::B32, "ctr");
            self.op("add.u32", vec![R(c1), R(c1_base), Imm(i64::from(s.dr))]);
            let c0 = self.reg(RegClass::B32, "ctr");
            if grouped {
                self.op("add.u32", vec![R(c0), R(c0_base), Imm(i64::from(s.dc >> 2))]);
                let words = self.philox([c0, c1, offset], [k0, k1]);
                // Every register of this aligned run of 4 takes its word.
                for (j, o) in slots.iter().enumerate() {
                    if o.dr == s.dr && o.dc >> 2 == s.dc >> 2 {
                        regs[j] = Some(self.unit_float(words[(o.dc & 3) as usize]));
                    }
                }
            } else {
                let jj = self.reg(RegClass::B32, "ctr");
                self.op("add.u32", vec![R(jj), R(lr.col), Imm(i64::from(s.dc))]);
                self.op("shr.u32", vec![R(c0), R(jj), Imm(2)]);
                self.op("add.u32", vec![R(c0), R(c0), R(col_q)]);
                let words = self.philox([c0, c1, offset], [k0, k1]);
                let w = self.reg(RegClass::B32, "word");
                self.op("and.b32", vec![R(jj), R(jj), Imm(3)]);
                self.op("mov.b32", vec![R(w), R(words[0])]);
                for (k, &word) in words.iter().enumerate().skip(1) {
                    let p = self.reg(RegClass::Pred, "word");
                    self.op("setp.eq.u32", vec![R(p), R(jj), Imm(k as i64)]);
                    self.op("selp.b32", vec![R(w), R(word), R(w), R(p)]);
                }
                regs[i] = Some(self.unit_float(w));
            }
        }
        let regs = regs.into_iter().map(|r| r.expect("every slot drew its number")).collect();
        Ok(TileVal { ty, layout, regs })
    }

    /// `Tile::<f32, M, N>::uniform8(seed_lo, seed_hi, offset, stream, [row, col])` (or, with
    /// `transposed`, `uniform8_t`) in `layout`: [`crate::random::uniform8`]'s bytes, origins
    /// multiples of 16. In a wgmma accumulator a thread's registers of 16 columns — rows `g`,
    /// `g + 8`, columns `2t, 2t + 1, 2t + 8, 2t + 9` — are half of one 4×4 block either way
    /// round, so one Philox call serves 8 registers: two words, a byte each (the word or the
    /// byte picked by the lane's row parity). Elsewhere each register makes its own call.
    fn uniform8(
        &mut self, ty: TileType, layout: Layout, transposed: bool, seed: &[Expr], origin: &[Expr],
    ) -> Result<TileVal, CompileError> {
        use Operand::{Imm, Reg as R};
        let args = self.rng_args(seed, origin)?;
        let [k0, k1, offset, stream, row, col] = args[..] else { unreachable!("verified TIR-H: four seed words and two indices") };
        let lr = self.layout_regs(layout);
        let slots = layout.slots();
        let mut regs = vec![None; slots.len()];
        let fast = matches!(layout.kind, LayoutKind::Wgmma { .. })
            && layout.keep_rows
            && layout.keep_cols
            && layout.parent_cols.is_multiple_of(16);
        if fast {
            // The host coordinates of the thread's first register: (tile row, tile col) or,
            // transposed, (tile col, tile row), from the origin.
            let (hr, hc) = (self.reg(RegClass::B32, "ctr"), self.reg(RegClass::B32, "ctr"));
            let (tr, tc) = if transposed { (lr.col, lr.row) } else { (lr.row, lr.col) };
            self.op("add.u32", vec![R(hr), R(row), R(tr)]);
            self.op("add.u32", vec![R(hc), R(col), R(tc)]);
            let (rb, cb) = (self.quad_key(hr), self.quad_key(hc));
            // The lane's row parity picks the word (or, transposed, the byte). Lanes l and l ^ 4
            // (rows g and g ^ 1) hold the two halves of each block.
            let odd = self.reg(RegClass::Pred, "odd");
            let bit = self.reg(RegClass::B32, "odd");
            self.op("and.b32", vec![R(bit), R(lr.row), Imm(1)]);
            self.op("setp.ne.u32", vec![R(odd), R(bit), Imm(0)]);
            let odd4 = self.reg(RegClass::B32, "odd");
            self.op("shl.b32", vec![R(odd4), R(bit), Imm(2)]);
            // Transposed, a lane keeps bytes of its parity of every word, packed two words to a
            // register: bytes {0, 2} (even) or {1, 3} (odd) of words 2m and 2m + 1.
            let sel = [(0x6420, 0x7531), (0x7531, 0x6420)].map(|(even, odd_sel)| {
                let r = self.reg(RegClass::B32, "sel");
                self.op("selp.b32", vec![R(r), Imm(odd_sel), Imm(even), R(odd)]);
                r
            });
            let (own_sel, other_sel) = (sel[0], sel[1]);
            // A group's two registers, from which each element's byte is at a place known here:
            // normal, the words of rows g and g + 8 (byte: the column's index); transposed, the
            // packed words (word 2m + w, half h: register m, byte 2w + h).
            let keep = |lw: &mut Self, words: [Reg; 4]| -> [Reg; 2] {
                [0, 2].map(|w| {
                    let x = lw.reg(RegClass::B32, "word");
                    if transposed {
                        lw.op("prmt.b32", vec![R(x), R(words[w]), R(words[w + 1]), R(own_sel)]);
                    } else {
                        lw.op("selp.b32", vec![R(x), R(words[w + 1]), R(words[w]), R(odd)]);
                    }
                    x
                })
            };
            let mut groups: Vec<(u32, u32)> = Vec::new();
            for s in &slots {
                let g = (s.dr & !8, s.dc & !15);
                if !groups.contains(&g) {
                    groups.push(g);
                }
            }
            let mut held: Vec<((u32, u32), [Reg; 2])> = Vec::new();
            let mut gi = 0;
            while gi < groups.len() {
                let (gr, gc) = groups[gi];
                let (er, ec) = if transposed { (gc, gr) } else { (gr, gc) };
                let (c0, c1) = (self.reg(RegClass::B32, "ctr"), self.reg(RegClass::B32, "ctr"));
                // quad_key(x + 16k) = quad_key(x) + 4k.
                self.op("add.u32", vec![R(c0), R(cb), Imm(i64::from(ec / 4))]);
                self.op("add.u32", vec![R(c1), R(rb), Imm(i64::from(er / 4))]);
                let paired = groups.get(gi + 1) == Some(&(gr, gc + 16));
                if !paired {
                    let words = self.philox4([c0, c1, offset, stream], [k0, k1]);
                    let k = keep(self, words);
                    held.push(((gr, gc), k));
                    gi += 1;
                    continue;
                }
                // Two groups 16 columns apart: the even lane draws the first's block, the odd
                // lane the second's, and each hands its partner the half it holds.
                let next = if transposed { c1 } else { c0 };
                self.op("add.u32", vec![R(next), R(next), R(odd4)]);
                let words = self.philox4([c0, c1, offset, stream], [k0, k1]);
                let mine = keep(self, words);
                let got = [0, 2].map(|w| {
                    let (send, recv) = (self.reg(RegClass::B32, "send"), self.reg(RegClass::B32, "recv"));
                    if transposed {
                        self.op("prmt.b32", vec![R(send), R(words[w]), R(words[w + 1]), R(other_sel)]);
                    } else {
                        self.op("selp.b32", vec![R(send), R(words[w]), R(words[w + 1]), R(odd)]);
                    }
                    self.op("shfl.sync.bfly.b32", vec![R(recv), R(send), Imm(4), Imm(31), Imm(-1)]);
                    recv
                });
                let (first, second) = ([(); 2].map(|_| self.reg(RegClass::B32, "word")), [(); 2].map(|_| self.reg(RegClass::B32, "word")));
                for h in 0..2 {
                    self.op("selp.b32", vec![R(first[h]), R(got[h]), R(mine[h]), R(odd)]);
                    self.op("selp.b32", vec![R(second[h]), R(mine[h]), R(got[h]), R(odd)]);
                }
                held.push(((gr, gc), first));
                held.push(((gr, gc + 16), second));
                gi += 2;
            }
            for (j, o) in slots.iter().enumerate() {
                let g = (o.dr & !8, o.dc & !15);
                let Some(&(_, x)) = held.iter().find(|(k, _)| *k == g) else { unreachable!("every group drew its block") };
                // The register's index along the 16 columns (bit 0 and bit 3) and its row half.
                let col_ix = (o.dc & 1) | ((o.dc >> 2) & 2);
                let half = o.dr & 8 != 0;
                let (reg, pos) = if transposed {
                    (x[(col_ix >> 1) as usize], 8 * (2 * (col_ix & 1) + u32::from(half)))
                } else {
                    (x[usize::from(half)], 8 * col_ix)
                };
                let byte = self.reg(RegClass::B32, "byte");
                self.op("bfe.u32", vec![R(byte), R(reg), Imm(i64::from(pos)), Imm(8)]);
                regs[j] = Some(self.byte_float(byte));
            }
        } else {
            for (i, s) in slots.iter().enumerate() {
                let (i_reg, j_reg) = (self.reg(RegClass::B32, "ctr"), self.reg(RegClass::B32, "ctr"));
                self.op("add.u32", vec![R(i_reg), R(lr.row), Imm(i64::from(s.dr))]);
                self.op("add.u32", vec![R(j_reg), R(lr.col), Imm(i64::from(s.dc))]);
                let (ti, tj) = if transposed { (j_reg, i_reg) } else { (i_reg, j_reg) };
                let (hr, hc) = (self.reg(RegClass::B32, "ctr"), self.reg(RegClass::B32, "ctr"));
                self.op("add.u32", vec![R(hr), R(row), R(ti)]);
                self.op("add.u32", vec![R(hc), R(col), R(tj)]);
                let (rb, cb) = (self.quad_key(hr), self.quad_key(hc));
                let (ri, ci) = (self.quad_index(hr), self.quad_index(hc));
                let words = self.philox4([cb, rb, offset, stream], [k0, k1]);
                let w = self.reg(RegClass::B32, "word");
                self.op("mov.b32", vec![R(w), R(words[0])]);
                for (k, &word) in words.iter().enumerate().skip(1) {
                    let p = self.reg(RegClass::Pred, "word");
                    self.op("setp.eq.u32", vec![R(p), R(ri), Imm(k as i64)]);
                    self.op("selp.b32", vec![R(w), R(word), R(w), R(p)]);
                }
                self.op("shl.b32", vec![R(ci), R(ci), Imm(3)]);
                let byte = self.reg(RegClass::B32, "byte");
                self.op("bfe.u32", vec![R(byte), R(w), R(ci), Imm(8)]);
                regs[i] = Some(self.byte_float(byte));
            }
        }
        let regs = regs.into_iter().map(|r| r.expect("every slot drew its number")).collect();
        Ok(TileVal { ty, layout, regs })
    }

    /// A `Tile::uniform*` constructor's seed words and origin, each as an `i32` register.
    fn rng_args(&mut self, seed: &[Expr], origin: &[Expr]) -> Result<Vec<Reg>, CompileError> {
        use crate::dtype::ScalarType;
        let mut args = Vec::new();
        for e in seed.iter().chain(origin) {
            let v = self.scalar(e)?;
            args.push(self.in_reg(v, ScalarType::I32, "rng"));
        }
        Ok(args)
    }

    /// [`crate::random::quad`]'s block of a coordinate: `((x >> 4) << 2) | ((x >> 1) & 3)`.
    fn quad_key(&mut self, x: Reg) -> Reg {
        use Operand::{Imm, Reg as R};
        let (a, b) = (self.reg(RegClass::B32, "quad"), self.reg(RegClass::B32, "quad"));
        self.op("shr.u32", vec![R(a), R(x), Imm(2)]);
        self.op("and.b32", vec![R(a), R(a), Imm(!3)]);
        self.op("bfe.u32", vec![R(b), R(x), Imm(1), Imm(2)]);
        self.op("or.b32", vec![R(a), R(a), R(b)]);
        a
    }

    /// [`crate::random::quad`]'s index in the block: bit 0, then bit 3 of `x`.
    fn quad_index(&mut self, x: Reg) -> Reg {
        use Operand::{Imm, Reg as R};
        let (a, b) = (self.reg(RegClass::B32, "quad"), self.reg(RegClass::B32, "quad"));
        self.op("and.b32", vec![R(a), R(x), Imm(1)]);
        self.op("shr.u32", vec![R(b), R(x), Imm(2)]);
        self.op("and.b32", vec![R(b), R(b), Imm(2)]);
        self.op("or.b32", vec![R(a), R(a), R(b)]);
        a
    }

    /// A byte as an f32 in `[0, 1)`: over 256.
    fn byte_float(&mut self, b: Reg) -> Reg {
        use Operand::{Reg as R, F32};
        let f = self.reg(RegClass::F32, "unif");
        self.op("cvt.rn.f32.u32", vec![R(f), R(b)]);
        self.op("mul.f32", vec![R(f), R(f), F32(1.0 / 256.0)]);
        f
    }

    /// Philox4x32-10 of the counter `(c0, c1, c2, 0)` under the key `(k0, k1)`: four words.
    fn philox(&mut self, c: [Reg; 3], key: [Reg; 2]) -> [Reg; 4] {
        use Operand::{Imm, Reg as R};
        let zero = self.reg(RegClass::B32, "ph");
        self.op("mov.u32", vec![R(zero), Imm(0)]);
        self.philox4([c[0], c[1], c[2], zero], key)
    }

    /// Philox4x32-10 of the counter `c` under the key `(k0, k1)`: four words.
    fn philox4(&mut self, c: [Reg; 4], key: [Reg; 2]) -> [Reg; 4] {
        use crate::random::{PHILOX_M, PHILOX_ROUNDS, PHILOX_W};
        use Operand::{Imm, Reg as R};
        let mut x = c;
        for r in 0..PHILOX_ROUNDS {
            // Round r's key: the seed plus r times Weyl's increments (wrapping).
            let k = [0, 1].map(|w| {
                let kr = self.reg(RegClass::B32, "phk");
                self.op("add.u32", vec![R(kr), R(key[w]), Imm(i64::from(PHILOX_W[w].wrapping_mul(r)))]);
                kr
            });
            let new = [(); 4].map(|_| self.reg(RegClass::B32, "ph"));
            let (hi0, hi1) = (self.reg(RegClass::B32, "ph"), self.reg(RegClass::B32, "ph"));
            self.op("mul.hi.u32", vec![R(hi0), R(x[0]), Imm(i64::from(PHILOX_M[0]))]);
            self.op("mul.lo.u32", vec![R(new[3]), R(x[0]), Imm(i64::from(PHILOX_M[0]))]);
            self.op("mul.hi.u32", vec![R(hi1), R(x[2]), Imm(i64::from(PHILOX_M[1]))]);
            self.op("mul.lo.u32", vec![R(new[1]), R(x[2]), Imm(i64::from(PHILOX_M[1]))]);
            self.op("xor.b32", vec![R(new[0]), R(hi1), R(x[1])]);
            self.op("xor.b32", vec![R(new[0]), R(new[0]), R(k[0])]);
            self.op("xor.b32", vec![R(new[2]), R(hi0), R(x[3])]);
            self.op("xor.b32", vec![R(new[2]), R(new[2]), R(k[1])]);
            x = new;
        }
        x
    }

    /// A Philox word as an f32 in `[0, 1)`: its top 24 bits times 2⁻²⁴.
    fn unit_float(&mut self, w: Reg) -> Reg {
        use Operand::{Imm, Reg as R, F32};
        let t = self.reg(RegClass::B32, "u24");
        self.op("shr.u32", vec![R(t), R(w), Imm(8)]);
        let f = self.reg(RegClass::F32, "unif");
        self.op("cvt.rn.f32.u32", vec![R(f), R(t)]);
        self.op("mul.f32", vec![R(f), R(f), F32(1.0 / 16_777_216.0)]);
        f
    }

    /// `t.mask_cols(limit, fill)`: each register whose column (the thread's base column plus
    /// the slot's offset) is at or past `limit` becomes `fill`; `limit` is an i32 for every
    /// row or an f32 column tile of one per row (laid out beside `t`, so each register finds
    /// its row's limit in its own thread).
    fn mask_cols(&mut self, t: TileVal, limit: &Expr, fill: &Expr) -> Result<TileVal, CompileError> {
        use Operand::{Imm, Reg as R};
        let per_row = match limit.checked_ty() {
            Type::Tile(lt) => {
                self.layout_hint = Some(t.layout.broadcast_operand(lt.rows, 1));
                let l = self.tile(limit);
                self.layout_hint = None;
                let l = l?;
                let want = t.layout.broadcast_operand(l.ty.rows, 1);
                Some(self.convert(l, want))
            }
            _ => None,
        };
        let lim = match per_row {
            Some(_) => None,
            None => {
                let v = self.scalar(limit)?;
                Some(self.in_reg(v, crate::dtype::ScalarType::I32, "limit"))
            }
        };
        let f = self.scalar(fill)?;
        let f = self.elem_from_f32(f, t.ty.dtype);
        let class = elem_class(t.ty.dtype);
        let fr = self.reg(class, "fill");
        self.op(super::mov_for(class), vec![R(fr), f]);
        let lr = self.layout_regs(t.layout);
        let sel = if class == RegClass::F32 { "selp.f32" } else { "selp.b16" };
        let slots = t.layout.slots();
        let regs = (0..t.regs.len())
            .map(|i| {
                let slot = slots[i];
                let (col, keep, out) = (self.reg(RegClass::B32, "col"), self.reg(RegClass::Pred, "keep"), self.reg(class, "masked"));
                self.op("add.s32", vec![R(col), R(lr.col), Imm(i64::from(slot.dc))]);
                match (&per_row, lim) {
                    (Some(l), _) => {
                        let fc = self.reg(RegClass::F32, "colf");
                        self.op("cvt.rn.f32.s32", vec![R(fc), R(col)]);
                        let j = t.layout.broadcast_slot(i, &l.layout);
                        self.op("setp.lt.f32", vec![R(keep), R(fc), R(l.regs[j])]);
                    }
                    (None, Some(lim)) => self.op("setp.lt.s32", vec![R(keep), R(col), R(lim)]),
                    (None, None) => unreachable!("a limit"),
                }
                self.op(sel, vec![R(out), R(t.regs[i]), R(fr), R(keep)]);
                out
            })
            .collect();
        Ok(TileVal { regs, ..t })
    }

    /// `t.keep_where(cond, fill)`: each register of `t` whose element of `cond` (lowered in
    /// `t`'s layout where it is free to take it, else moved into its broadcast layout) is
    /// below 0 becomes `fill`.
    fn keep_where(&mut self, value: &Expr, cond: &Expr, fill: &Expr, ty: TileType) -> Result<TileVal, CompileError> {
        use Operand::Reg as R;
        // An index condition: each element's computed beside its selection (no whole tile of
        // conditions live at once).
        if index_like(cond, &self.deferred) {
            let t = self.tile(value)?;
            let (fr, class, sel) = self.fill_select(fill, t.ty.dtype)?;
            let regs = self.beside_index(&t, |lw, base, at, x, memo| {
                let keep = lw.index_nonnegative(cond, base, at, memo);
                let out = lw.reg(class, "kept");
                lw.op(sel, vec![R(out), R(x), R(fr), R(keep)]);
                out
            });
            return Ok(TileVal { regs, ..t });
        }
        let (t, c) = self.operands(value, cond, ty)?;
        let want = t.layout.broadcast_operand(c.ty.rows, c.ty.cols);
        let c = self.convert(c, want);
        let (fr, class, sel) = self.fill_select(fill, t.ty.dtype)?;
        let regs = (0..t.regs.len())
            .map(|i| {
                let j = t.layout.broadcast_slot(i, &c.layout);
                let (keep, out) = (self.reg(RegClass::Pred, "keep"), self.reg(class, "kept"));
                self.op("setp.ge.f32", vec![R(keep), R(c.regs[j]), Operand::F32(0.0)]);
                self.op(sel, vec![R(out), R(t.regs[i]), R(fr), R(keep)]);
                out
            })
            .collect();
        Ok(TileVal { regs, ..t })
    }

    /// `keep_where`'s fill in a register of a `dtype` tile's class, that class, and the
    /// selection instruction for it.
    fn fill_select(&mut self, fill: &Expr, dtype: DType) -> Result<(Reg, RegClass, &'static str), CompileError> {
        let f = self.scalar(fill)?;
        let f = self.elem_from_f32(f, dtype);
        let class = elem_class(dtype);
        let fr = self.reg(class, "fill");
        self.op(super::mov_for(class), vec![Operand::Reg(fr), f]);
        Ok((fr, class, if class == RegClass::F32 { "selp.f32" } else { "selp.b16" }))
    }

    /// `Tile::full(v)` in `layout`.
    pub(crate) fn full(&mut self, e: &Expr, ty: TileType, layout: Layout) -> Result<TileVal, CompileError> {
        let ExprKind::Full { value, .. } = &e.kind else { unreachable!("a Full expression") };
        let v = self.scalar(value)?;
        let src = self.elem_from_f32(v, ty.dtype);
        let regs = (0..layout.len())
            .map(|_| {
                let r = self.reg(elem_class(ty.dtype), "full");
                self.op(super::mov_for(r.class), vec![Operand::Reg(r), src.clone()]);
                r
            })
            .collect();
        Ok(TileVal { ty, layout, regs })
    }

    /// An f32 operand as an element of `dtype` (an immediate or a register).
    fn elem_from_f32(&mut self, v: Operand, dtype: DType) -> Operand {
        match dtype {
            DType::F32 | DType::I32 => v,
            DType::BF16 | DType::F16 | DType::F8E4M3 | DType::F8E5M2 => {
                let f = match v {
                    Operand::Reg(r) => r,
                    other => {
                        let r = self.reg(RegClass::F32, "c");
                        self.op("mov.f32", vec![Operand::Reg(r), other]);
                        r
                    }
                };
                Operand::Reg(self.f32_to(f, dtype))
            }
        }
    }

    /// Converts an f32 register to an element of `dtype`, rounding to nearest even.
    pub(crate) fn f32_to(&mut self, f: Reg, dtype: DType) -> Reg {
        match dtype {
            DType::F32 | DType::I32 => f,
            DType::BF16 | DType::F16 => {
                let h = self.reg(RegClass::B16, dtype.name());
                self.op(&format!("cvt.rn.{}.f32", dtype.name()), vec![Operand::Reg(h), Operand::Reg(f)]);
                h
            }
            DType::F8E4M3 | DType::F8E5M2 => {
                // `cvt` makes fp8 in pairs, the first operand in the high byte: 0.0 there
                // leaves the code alone in the low byte, the high byte 0 (code 0x00).
                self.uses_fp8 = true;
                let name = dtype.fp8_cvt_name().expect("an fp8 type");
                let (zero, h) = (self.reg(RegClass::F32, "zero"), self.reg(RegClass::B16, dtype.name()));
                self.op("mov.f32", vec![Operand::Reg(zero), Operand::F32(0.0)]);
                self.op(&format!("cvt.rn.satfinite.{name}x2.f32"), vec![Operand::Reg(h), Operand::Reg(zero), Operand::Reg(f)]);
                h
            }
        }
    }

    /// Widens an element of `dtype` to f32 (exact).
    pub(crate) fn widen_f32(&mut self, r: Reg, dtype: DType) -> Reg {
        use Operand::{Imm, Reg as R};
        match dtype {
            DType::F32 | DType::I32 => r,
            DType::F16 => {
                let f = self.reg(RegClass::F32, "wide");
                self.op("cvt.f32.f16", vec![R(f), R(r)]);
                f
            }
            DType::BF16 => {
                // A bf16 is the high half of an f32: shift it there (valid on sm_80 too).
                let u = self.reg(RegClass::B32, "bits");
                self.op("cvt.u32.u16", vec![R(u), R(r)]);
                self.op("shl.b32", vec![R(u), R(u), Imm(16)]);
                let f = self.reg(RegClass::F32, "wide");
                self.op("mov.b32", vec![R(f), R(u)]);
                f
            }
            DType::F8E4M3 | DType::F8E5M2 => {
                // Both bytes to f16 (exact: f16 holds every e4m3 and e5m2 value), the low one
                // on to f32.
                self.uses_fp8 = true;
                let name = dtype.fp8_cvt_name().expect("an fp8 type");
                let w = self.reg(RegClass::B32, "f16x2");
                self.op(&format!("cvt.rn.f16x2.{name}x2"), vec![R(w), R(r)]);
                let (lo, hi) = (self.reg(RegClass::B16, "lo"), self.reg(RegClass::B16, "hi"));
                self.op("mov.b32", vec![Operand::Vec(vec![lo, hi]), R(w)]);
                let f = self.reg(RegClass::F32, "wide");
                self.op("cvt.f32.f16", vec![R(f), R(lo)]);
                f
            }
        }
    }

    /// Applies `f` to each element, computing in f32 and rounding back to the tile's dtype.
    fn map_f32(&mut self, t: &TileVal, _hint: &str, mut f: impl FnMut(&mut Self, Reg) -> Reg) -> TileVal {
        let regs = t
            .regs
            .iter()
            .map(|&r| {
                let x = self.widen_f32(r, t.ty.dtype);
                let y = f(self, x);
                self.f32_to(y, t.ty.dtype)
            })
            .collect();
        TileVal { regs, ..t.clone() }
    }

    pub(crate) fn cast(&mut self, t: TileVal, to: DType) -> TileVal {
        if t.ty.dtype == to {
            return t;
        }
        let wide: Vec<Reg> = t.regs.iter().map(|&r| self.widen_f32(r, t.ty.dtype)).collect();
        let regs = if matches!(to, DType::BF16 | DType::F16) {
            // Two at a time: one `cvt.rn.{bf16x2,f16x2}.f32` rounds a pair as two single
            // conversions would, in one instruction; the halves are named apart again.
            let mut out = Vec::with_capacity(wide.len());
            for pair in wide.chunks(2) {
                match *pair {
                    [lo, hi] => {
                        let w = self.reg(RegClass::B32, "pair");
                        self.op(&format!("cvt.rn.{}x2.f32", to.name()), vec![Operand::Reg(w), Operand::Reg(hi), Operand::Reg(lo)]);
                        let (a, b) = (self.reg(RegClass::B16, to.name()), self.reg(RegClass::B16, to.name()));
                        self.op("mov.b32", vec![Operand::Vec(vec![a, b]), Operand::Reg(w)]);
                        out.extend([a, b]);
                    }
                    [one] => out.push(self.f32_to(one, to)),
                    _ => unreachable!("chunks of two"),
                }
            }
            out
        } else {
            wide.into_iter().map(|f| self.f32_to(f, to)).collect()
        };
        TileVal { ty: TileType { dtype: to, ..t.ty }, layout: t.layout, regs }
    }

    fn binary(&mut self, op: BinOp, a: &Expr, b: &Expr, ty: TileType) -> Result<TileVal, CompileError> {
        let inst = super::scalar::scalar_binop(op, crate::dtype::ScalarType::F32);
        let (a_tile, b_tile) = (matches!(a.checked_ty(), Type::Tile(_)), matches!(b.checked_ty(), Type::Tile(_)));
        match (a_tile, b_tile) {
            // A full tile and an index tile: each index element computed beside its use.
            (true, true) if per_element(a, &self.deferred) != per_element(b, &self.deferred) && ty.dtype == DType::F32 => {
                let (idx, other, idx_left) = if per_element(a, &self.deferred) { (a, b, true) } else { (b, a, false) };
                let Type::Tile(ot) = other.checked_ty() else { unreachable!("a tile operand") };
                if (ot.rows, ot.cols) != (ty.rows, ty.cols) {
                    let (ta, tb) = self.operands(a, b, ty)?;
                    return Ok(self.broadcast_binary(&inst, ta, tb, ty));
                }
                let t = self.tile(other)?;
                let regs = self.beside_index(&t, |lw, base, at, x, memo| {
                    let c = lw.index_elem(idx, base, at, memo);
                    let x = lw.widen_f32(x, t.ty.dtype);
                    let (l, r) = if idx_left { (c, x) } else { (x, c) };
                    let out = lw.reg(RegClass::F32, "t");
                    lw.op(&inst, vec![Operand::Reg(out), Operand::Reg(l), Operand::Reg(r)]);
                    out
                });
                Ok(TileVal { ty, layout: t.layout, regs })
            }
            (true, true) => {
                let (ta, tb) = self.operands(a, b, ty)?;
                Ok(self.broadcast_binary(&inst, ta, tb, ty))
            }
            (true, false) | (false, true) => {
                let (t, s, tile_left) =
                    if a_tile { (self.tile(a)?, self.scalar(b)?, true) } else { (self.tile(b)?, self.scalar(a)?, false) };
                let s = Operand::Reg(self.in_reg(s, crate::dtype::ScalarType::F32, "s"));
                Ok(self.map_f32(&t, "t", |lw, x| {
                    let out = lw.reg(RegClass::F32, "t");
                    let args = if tile_left {
                        vec![Operand::Reg(out), Operand::Reg(x), s.clone()]
                    } else {
                        vec![Operand::Reg(out), s.clone(), Operand::Reg(x)]
                    };
                    lw.op(&inst, args);
                    out
                }))
            }
            (false, false) => unreachable!("verified TIR-H: a tile operation has a tile operand"),
        }
    }

    /// `inst` elementwise between two lowered tiles, one of the result's shape `ty` and the
    /// other of it or broadcast to it (moved into its broadcast layout).
    fn broadcast_binary(&mut self, inst: &str, ta: TileVal, tb: TileVal, ty: TileType) -> TileVal {
        // The operand with the result's shape sets the layout; the other broadcasts.
        let (big, small, big_left) = if ta.ty.rows == ty.rows && ta.ty.cols == ty.cols { (ta, tb, true) } else { (tb, ta, false) };
        let want = big.layout.broadcast_operand(small.ty.rows, small.ty.cols);
        let small = self.convert(small, want);
        let regs = (0..big.regs.len())
            .map(|i| {
                let j = big.layout.broadcast_slot(i, &small.layout);
                let x = self.widen_f32(big.regs[i], ty.dtype);
                let y = self.widen_f32(small.regs[j], ty.dtype);
                let (l, r) = if big_left { (x, y) } else { (y, x) };
                let out = self.reg(RegClass::F32, "t");
                self.op(inst, vec![Operand::Reg(out), Operand::Reg(l), Operand::Reg(r)]);
                self.f32_to(out, ty.dtype)
            })
            .collect();
        TileVal { ty, layout: big.layout, regs }
    }

    /// Lowers the two tile operands of an elementwise operation. An operand whose layout is
    /// free (a load, possibly under casts, unary functions and scalar factors) is lowered
    /// second, in the layout the other operand needs, so that nothing moves through shared
    /// memory.
    fn operands(&mut self, a: &Expr, b: &Expr, ty: TileType) -> Result<(TileVal, TileVal), CompileError> {
        let shape = |e: &Expr| match e.checked_ty() {
            Type::Tile(t) => (t.rows, t.cols),
            _ => (0, 0),
        };
        let full = |e: &Expr| shape(e) == (ty.rows, ty.cols);
        let free = |lw: &Self, e: &Expr| layout_free(e) || index_like(e, &lw.deferred);
        if free(self, a) && !free(self, b) && full(b) {
            let tb = self.tile(b)?;
            let (r, c) = shape(a);
            self.layout_hint = Some(tb.layout.broadcast_operand(r, c));
            let ta = self.tile(a);
            self.layout_hint = None;
            return Ok((ta?, tb));
        }
        let ta = self.tile(a)?;
        if free(self, b) && full(a) {
            let (r, c) = shape(b);
            self.layout_hint = Some(ta.layout.broadcast_operand(r, c));
        }
        let tb = self.tile(b);
        self.layout_hint = None;
        Ok((ta, tb?))
    }

    /// Moves a tile into another layout of the same shape: by renaming registers where every
    /// thread already holds the elements it needs, else through shared memory.
    pub(crate) fn convert(&mut self, t: TileVal, to: Layout) -> TileVal {
        if t.layout == to {
            return t;
        }
        if let Some(map) = t.layout.local_map(&to) {
            return TileVal { ty: t.ty, layout: to, regs: map.iter().map(|&i| t.regs[i]).collect() };
        }
        use Operand::{Addr, Reg as R};
        let es = t.ty.dtype.size();
        let cols = t.ty.cols;
        self.need_scratch(t.ty.rows * cols * es);
        let st = format!("st.shared.{}", super::bits(es));
        let ld = format!("ld.shared.{}", super::bits(es));
        // Each owner writes its elements at [row][col]; then each thread reads its new ones.
        self.warpgroup_barrier();
        let from = self.layout_regs(t.layout);
        let base = self.thread_offset(from, cols, es);
        for (slot, &r) in t.layout.slots().iter().zip(&t.regs) {
            let off = i64::from((slot.dr * cols + slot.dc) * es);
            self.op_if(from.owner, false, &st, vec![Addr(base, off), R(r)]);
        }
        self.warpgroup_barrier();
        let dst = self.layout_regs(to);
        let base = self.thread_offset(dst, cols, es);
        let regs = to
            .slots()
            .iter()
            .map(|slot| {
                let r = self.reg(elem_class(t.ty.dtype), "cvt");
                let off = i64::from((slot.dr * cols + slot.dc) * es);
                self.op(&ld, vec![R(r), Addr(base, off)]);
                r
            })
            .collect();
        // No barrier after the reads: every scratch user starts with one.
        TileVal { ty: t.ty, layout: to, regs }
    }

    /// `t.shift_cols(by, fill)` (`axis` 1) or `shift_rows`: through the warpgroup's scratch —
    /// each owner writes its elements at `[row][col]`, then each thread reads, for each of its
    /// elements, the one `by` columns (rows) back (ahead, `reverse`), or takes `fill` where
    /// there is none. A shift past the whole tile is `fill` everywhere, with no memory traffic.
    pub(crate) fn shift(&mut self, t: TileVal, axis: u32, by: u32, reverse: bool, fill: Reg) -> TileVal {
        use Operand::{Addr, Reg as R};
        let (rows, cols) = (t.ty.rows, t.ty.cols);
        let n = if axis == 1 { cols } else { rows };
        if by == 0 {
            return t;
        }
        if let Some(regs) = self.shift_in_warp(&t, axis, by, reverse, fill) {
            return TileVal { ty: t.ty, layout: t.layout, regs };
        }
        let regs: Vec<Reg> = if by >= n {
            t.regs
                .iter()
                .map(|_| {
                    let r = self.reg(RegClass::F32, "shift");
                    self.op("mov.f32", vec![R(r), R(fill)]);
                    r
                })
                .collect()
        } else {
            self.need_scratch(rows * cols * 4);
            self.warpgroup_barrier();
            let l = self.layout_regs(t.layout);
            let base = self.thread_offset(l, cols, 4);
            for (slot, &r) in t.layout.slots().iter().zip(&t.regs) {
                let off = i64::from((slot.dr * cols + slot.dc) * 4);
                self.op_if(l.owner, false, "st.shared.f32", vec![Addr(base, off), R(r)]);
            }
            self.warpgroup_barrier();
            let back = i64::from(if axis == 1 { by * 4 } else { by * cols * 4 }) * if reverse { -1 } else { 1 };
            t.layout
                .slots()
                .iter()
                .map(|slot| {
                    let has = self.shift_source_inside(l, slot, axis, n, by, reverse);
                    let r = self.reg(RegClass::F32, "shift");
                    self.op("mov.f32", vec![R(r), R(fill)]);
                    let off = i64::from((slot.dr * cols + slot.dc) * 4) - back;
                    self.op_if(has, false, "ld.shared.f32", vec![R(r), Addr(base, off)]);
                    r
                })
                .collect()
            // No barrier after the reads: every scratch user starts with one.
        };
        TileVal { ty: t.ty, layout: t.layout, regs }
    }

    /// `t.shift_cols(by, from)` with `from` a tile of `t`'s type (a funnel shift): as
    /// [`Self::shift`], the elements shifted in taken from `from` — the window `by` back along
    /// `[from | t]` (ahead along `[t | from]`, `reverse`). In one warp's lanes where each row
    /// lies in one warp ([`Self::funnel_in_warp`]), else through the warpgroup's scratch.
    fn funnel(&mut self, t: TileVal, from: TileVal, axis: u32, by: u32, reverse: bool) -> TileVal {
        use Operand::{Addr, Reg as R};
        let from = self.convert(from, t.layout);
        let (rows, cols) = (t.ty.rows, t.ty.cols);
        let n = if axis == 1 { cols } else { rows };
        if by == 0 {
            return t;
        }
        if by == n {
            return from;
        }
        if let Some(regs) = self.funnel_in_warp(&t, &from, axis, by, reverse) {
            return TileVal { ty: t.ty, layout: t.layout, regs };
        }
        // `from` at [row][col] of the scratch's first half, `t` of its second.
        let half = rows * cols * 4;
        self.need_scratch(2 * half);
        self.warpgroup_barrier();
        let l = self.layout_regs(t.layout);
        let base = self.thread_offset(l, cols, 4);
        for (slot, (&f, &r)) in t.layout.slots().iter().zip(from.regs.iter().zip(&t.regs)) {
            let off = i64::from((slot.dr * cols + slot.dc) * 4);
            self.op_if(l.owner, false, "st.shared.f32", vec![Addr(base, off), R(f)]);
            self.op_if(l.owner, false, "st.shared.f32", vec![Addr(base, off + i64::from(half)), R(r)]);
        }
        self.warpgroup_barrier();
        // Along the axis, one element is `step` bytes on; the element `by` back (ahead) lies in
        // `t` where the index allows, else `n` on (back) in `from`.
        let step = i64::from(if axis == 1 { 4 } else { cols * 4 });
        let back = i64::from(by) * step * if reverse { -1 } else { 1 };
        let wrap = i64::from(n) * step * if reverse { -1 } else { 1 };
        let regs = t
            .layout
            .slots()
            .iter()
            .map(|slot| {
                let mine = self.shift_source_inside(l, slot, axis, n, by, reverse);
                let r = self.reg(RegClass::F32, "shift");
                let off = i64::from((slot.dr * cols + slot.dc) * 4) - back;
                self.op_if(mine, false, "ld.shared.f32", vec![R(r), Addr(base, off + i64::from(half))]);
                self.op_if(mine, true, "ld.shared.f32", vec![R(r), Addr(base, off + wrap)]);
                r
            })
            .collect();
        // No barrier after the reads: every scratch user starts with one.
        TileVal { ty: t.ty, layout: t.layout, regs }
    }

    /// Whether the element of `slot` (this thread's, in the layout whose registers are `l`) has
    /// its source `by` back (ahead, `reverse`) along `axis` inside the tile (`n` long there).
    fn shift_source_inside(&mut self, l: super::LayoutRegs, slot: &crate::layout::Slot, axis: u32, n: u32, by: u32, reverse: bool) -> Reg {
        use Operand::{Imm, Reg as R};
        let (at, d) = if axis == 1 { (l.col, slot.dc) } else { (l.row, slot.dr) };
        let idx = self.reg(RegClass::B32, "shidx");
        self.op("add.u32", vec![R(idx), R(at), Imm(i64::from(d))]);
        let inside = self.reg(RegClass::Pred, "shin");
        if reverse {
            self.op("setp.lt.u32", vec![R(inside), R(idx), Imm(i64::from(n - by))]);
        } else {
            self.op("setp.ge.u32", vec![R(inside), R(idx), Imm(i64::from(by))]);
        }
        inside
    }

    /// [`Self::funnel`] in one warp's lanes, where [`Self::shift_in_warp`] applies: the
    /// elements that cross lanes come by one `shfl.sync.idx` each, from the lane `by / v` back
    /// (ahead) around the row's lanes; the lanes that wrap around provide `from`'s register
    /// instead of `t`'s.
    fn funnel_in_warp(&mut self, t: &TileVal, from: &TileVal, axis: u32, by: u32, reverse: bool) -> Option<Vec<Reg>> {
        use Operand::{Imm, Reg as R};
        let (l, v, tc) = in_warp_shift(t, axis, by)?;
        let slots = l.slots();
        let at = |dr: u32, dc: u32| slots.iter().position(|s| s.dr == dr && s.dc == dc);
        let lr = self.layout_regs(l);
        let lanes = if by < v { 1 } else { by / v };
        // The source lane, `lanes` around this row's lanes, and whether this lane is read by
        // one that wraps (it provides `from`'s register): its run within the row is among the
        // last `lanes` (first, `reverse`).
        let (src_lane, wraps) = (self.reg(RegClass::B32, "fsrc"), self.reg(RegClass::Pred, "fwrap"));
        let (row_lanes, turn) = (self.reg(RegClass::B32, "frow"), self.reg(RegClass::B32, "fturn"));
        self.op("and.b32", vec![R(row_lanes), R(self.lane), Imm(i64::from(!(tc - 1) & 31))]);
        let delta = if reverse { i64::from(lanes) } else { -i64::from(lanes) };
        self.op("add.s32", vec![R(turn), R(self.lane), Imm(delta)]);
        self.op("and.b32", vec![R(turn), R(turn), Imm(i64::from(tc - 1))]);
        self.op("or.b32", vec![R(src_lane), R(row_lanes), R(turn)]);
        if reverse {
            self.op("setp.lt.u32", vec![R(wraps), R(lr.col), Imm(i64::from(lanes * v))]);
        } else {
            self.op("setp.ge.u32", vec![R(wraps), R(lr.col), Imm(i64::from((tc - lanes) * v))]);
        }
        let mut out = Vec::with_capacity(slots.len());
        for slot in &slots {
            let r = self.reg(RegClass::F32, "shift");
            let own = if reverse { (slot.dc + by < v).then(|| slot.dc + by) } else { (by < v && slot.dc >= by).then(|| slot.dc - by) };
            if let (true, Some(dc)) = (by < v, own) {
                let src = t.regs[at(slot.dr, dc)?];
                self.op("mov.f32", vec![R(r), R(src)]);
                out.push(r);
                continue;
            }
            let k = match (by < v, reverse) {
                (true, false) => at(slot.dr, slot.dc + v - by)?,
                (true, true) => at(slot.dr, slot.dc + by - v)?,
                (false, _) => at(slot.dr, slot.dc)?,
            };
            let give = self.reg(RegClass::F32, "fgive");
            self.op("selp.f32", vec![R(give), R(from.regs[k]), R(t.regs[k]), R(wraps)]);
            self.op("shfl.sync.idx.b32", vec![R(r), R(give), R(src_lane), Imm(31), Imm(-1)]);
            out.push(r);
        }
        Some(out)
    }

    /// `shift_cols(by, fill)` without shared memory where each row lies in one warp's lanes
    /// (a blocked layout whose runs of `v` columns, one per lane, cover the row once): an
    /// element `by` columns back (ahead, `reverse`) is this thread's own register (within the
    /// run) or the same run position of the lane `by / v` before (after) — `shfl.sync.up`
    /// (`down`) — or, for a shift under `v` that crosses a run's edge, the neighbouring lane's
    /// register; `fill` where no column lies there. `None` where the layout does not allow it.
    fn shift_in_warp(&mut self, t: &TileVal, axis: u32, by: u32, reverse: bool, fill: Reg) -> Option<Vec<Reg>> {
        use Operand::{Imm, Reg as R};
        if let Some(regs) = self.shift_in_warp_segments(t, axis, by, reverse, fill) {
            return Some(regs);
        }
        let (l, v, _) = in_warp_shift(t, axis, by)?;
        let n = l.parent_cols;
        let slots = l.slots();
        let at = |dr: u32, dc: u32| slots.iter().position(|s| s.dr == dr && s.dc == dc);
        let lr = self.layout_regs(l);
        let mut out = Vec::with_capacity(slots.len());
        for (i, slot) in slots.iter().enumerate() {
            let r = self.reg(RegClass::F32, "shift");
            // Within this thread's run.
            let own = if reverse { (slot.dc + by < v).then(|| slot.dc + by) } else { (by < v && slot.dc >= by).then(|| slot.dc - by) };
            if let (true, Some(dc)) = (by < v, own) {
                let src = t.regs[at(slot.dr, dc)?];
                self.op("mov.f32", vec![R(r), R(src)]);
                out.push(r);
                continue;
            }
            let (src, lanes) = match (by < v, reverse) {
                (true, false) => (t.regs[at(slot.dr, slot.dc + v - by)?], 1),
                (true, true) => (t.regs[at(slot.dr, slot.dc + by - v)?], 1),
                (false, _) => (t.regs[i], by / v),
            };
            let got = self.reg(RegClass::F32, "shfl");
            // The element's column, and whether one lies `by` before (after) it in its row.
            let idx = self.reg(RegClass::B32, "shidx");
            self.op("add.u32", vec![R(idx), R(lr.col), Imm(i64::from(slot.dc))]);
            let has = self.reg(RegClass::Pred, "shin");
            if reverse {
                self.op("shfl.sync.down.b32", vec![R(got), R(src), Imm(i64::from(lanes)), Imm(31), Imm(-1)]);
                self.op("setp.lt.u32", vec![R(has), R(idx), Imm(i64::from(n - by))]);
            } else {
                self.op("shfl.sync.up.b32", vec![R(got), R(src), Imm(i64::from(lanes)), Imm(0), Imm(-1)]);
                self.op("setp.ge.u32", vec![R(has), R(idx), Imm(i64::from(by))]);
            }
            self.op("selp.f32", vec![R(r), R(got), R(fill), R(has)]);
            out.push(r);
        }
        Some(out)
    }

    /// [`Self::shift_in_warp`] for a row that a warp's lanes cover in several passes (`k`
    /// segments of `v·tc` columns, a run a lane in each: a `4×1024` tile's four 256-column
    /// segments), shifted by less than a run or by whole runs less than a segment: an element
    /// whose source lies in its own run moves between registers; else one `shfl.sync.idx` a
    /// receiving slot from the lane `by / v` (or 1) before (after) in the row's lanes, where the
    /// lanes that wrap around to the row's first (last) ones send their register of the segment
    /// before (after) — the one that lies `by` columns back from the receiver.
    fn shift_in_warp_segments(&mut self, t: &TileVal, axis: u32, by: u32, reverse: bool, fill: Reg) -> Option<Vec<Reg>> {
        use Operand::{Imm, Reg as R};
        let l = t.layout;
        let LayoutKind::Blocked { v, tc, wc: 1, .. } = l.kind else { return None };
        let (n, seg) = (l.parent_cols, v * tc);
        let fits = axis == 1
            && l.keep_rows
            && l.keep_cols
            && v.is_power_of_two()
            && tc.is_power_of_two()
            && n > seg
            && n.is_multiple_of(seg)
            && by > 0
            && (by < v || (by.is_multiple_of(v) && by < seg))
            && t.ty.dtype == DType::F32;
        if !fits {
            return None;
        }
        let slots = l.slots();
        let at = |dr: u32, dc: u32| slots.iter().position(|s| s.dr == dr && s.dc == dc);
        let lr = self.layout_regs(l);
        let lanes = if by < v { 1 } else { by / v };
        // The source lane, `lanes` on (back) within the row's `tc` lanes, and whether this lane,
        // as a sender, wraps to the segment before (after).
        let (src_lane, wraps) = (self.reg(RegClass::B32, "shsrc"), self.reg(RegClass::Pred, "shwrap"));
        let (within, group) = (self.reg(RegClass::B32, "shin_row"), self.reg(RegClass::B32, "shgroup"));
        let step = if reverse { lanes } else { tc - lanes };
        self.op("add.u32", vec![R(within), R(self.lane), Imm(i64::from(step))]);
        self.op("and.b32", vec![R(within), R(within), Imm(i64::from(tc - 1))]);
        self.op("and.b32", vec![R(group), R(self.lane), Imm(i64::from(!(tc - 1) & 31))]);
        self.op("or.b32", vec![R(src_lane), R(group), R(within)]);
        let mine = self.reg(RegClass::B32, "shmine");
        self.op("and.b32", vec![R(mine), R(self.lane), Imm(i64::from(tc - 1))]);
        if reverse {
            self.op("setp.lt.u32", vec![R(wraps), R(mine), Imm(i64::from(lanes))]);
        } else {
            self.op("setp.ge.u32", vec![R(wraps), R(mine), Imm(i64::from(tc - lanes))]);
        }
        let mut out = Vec::with_capacity(slots.len());
        for slot in &slots {
            let r = self.reg(RegClass::F32, "shift");
            let (j, s) = (slot.dc % v, slot.dc / seg);
            if by < v && ((!reverse && j >= by) || (reverse && j + by < v)) {
                let src = t.regs[at(slot.dr, if reverse { slot.dc + by } else { slot.dc - by })?];
                self.op("mov.f32", vec![R(r), R(src)]);
                out.push(r);
                continue;
            }
            // The sender's slot in the receiver's segment, and in the one before (after).
            let same = match (by < v, reverse) {
                (true, false) => slot.dc + v - by,
                (true, true) => slot.dc + by - v,
                (false, _) => slot.dc,
            };
            let other = match reverse {
                false if s > 0 => same - seg,
                true if s + 1 < n / seg => same + seg,
                _ => same,
            };
            let (a, b) = (t.regs[at(slot.dr, same)?], t.regs[at(slot.dr, other)?]);
            let sent = self.reg(RegClass::F32, "shsend");
            self.op("selp.f32", vec![R(sent), R(b), R(a), R(wraps)]);
            let got = self.reg(RegClass::F32, "shfl");
            self.op("shfl.sync.idx.b32", vec![R(got), R(sent), R(src_lane), Imm(31), Imm(-1)]);
            let (idx, has) = (self.reg(RegClass::B32, "shidx"), self.reg(RegClass::Pred, "shin"));
            self.op("add.u32", vec![R(idx), R(lr.col), Imm(i64::from(slot.dc))]);
            if reverse {
                self.op("setp.lt.u32", vec![R(has), R(idx), Imm(i64::from(n - by))]);
            } else {
                self.op("setp.ge.u32", vec![R(has), R(idx), Imm(i64::from(by))]);
            }
            self.op("selp.f32", vec![R(r), R(got), R(fill), R(has)]);
            out.push(r);
        }
        Some(out)
    }

    /// A scan step's operand ([`ScanStep`]) in the tile's blocked layout, where a thread's run
    /// is its `v` slots of a row in one segment: a serial step moves the register of the column
    /// before (after, in a reverse scan), a lanes step shuffles the run's last (first) register
    /// up (down) `s` lanes, the apply step shuffles it one lane for the run's other columns, a
    /// segment step takes the last (first) lane's last (first) register of the segment before;
    /// `fill` where no column lies there and in the slots the step leaves alone.
    fn scan_part(&mut self, t: TileVal, step: ScanStep, fill: Reg) -> TileVal {
        use Operand::{Imm, Reg as R};
        let to = Layout::blocked(t.ty.rows, t.ty.cols);
        let t = self.convert(t, to);
        let slots = to.slots();
        let at = |dr: u32, dc: u32| slots.iter().position(|s| s.dr == dr && s.dc == dc).expect("a blocked run holds every column");
        let base_col = self.layout_regs(to).col;
        let (v, seg) = (step.v, step.seg);
        // The run's last slot in the scan's order, and where a serial step's source lies.
        let (last, back) = if step.reverse { (0, -1i64) } else { (v - 1, 1) };
        // A segment step's source: the lane holding the row's segment's last (first) column.
        let edge_lane = matches!(step.kind, ScanKind::Segment(_)).then(|| {
            let (lane, tc) = (self.reg(RegClass::B32, "seglane"), seg / v);
            if step.reverse {
                self.op("and.b32", vec![R(lane), R(self.lane), Imm(i64::from(!(tc - 1) & 31))]);
            } else {
                self.op("or.b32", vec![R(lane), R(self.lane), Imm(i64::from(tc - 1))]);
            }
            lane
        });
        // One shuffle per run and segment (the apply step's columns share it).
        let mut shuffled: Vec<((u32, u32), Reg)> = Vec::new();
        let mut regs = Vec::with_capacity(slots.len());
        for slot in &slots {
            let r = self.reg(RegClass::F32, "scan");
            let segment = slot.dc / seg;
            let lanes = match step.kind {
                _ if !step.touches_slot(slot.dc) => None,
                ScanKind::Serial(_) => {
                    let src = t.regs[at(slot.dr, (i64::from(slot.dc) - back) as u32)];
                    self.op("mov.f32", vec![R(r), R(src)]);
                    regs.push(r);
                    continue;
                }
                ScanKind::Lanes(s) => Some(s),
                ScanKind::Apply => Some(1),
                ScanKind::Segment(_) => Some(0),
            };
            let Some(lanes) = lanes else {
                self.op("mov.f32", vec![R(r), R(fill)]);
                regs.push(r);
                continue;
            };
            let got = match shuffled.iter().find(|(key, _)| *key == (slot.dr, segment)) {
                Some(&(_, g)) => g,
                None => {
                    let g = self.reg(RegClass::F32, "scanin");
                    if let Some(lane) = edge_lane {
                        let from = if step.reverse { (segment + 1) * seg } else { (segment - 1) * seg + v - 1 };
                        let src = t.regs[at(slot.dr, from)];
                        self.op("shfl.sync.idx.b32", vec![R(g), R(src), R(lane), Imm(31), Imm(-1)]);
                    } else {
                        let src = t.regs[at(slot.dr, segment * seg + last)];
                        let got = self.reg(RegClass::F32, "shfl");
                        let has = self.reg(RegClass::Pred, "shin");
                        if step.reverse {
                            self.op("shfl.sync.down.b32", vec![R(got), R(src), Imm(i64::from(lanes)), Imm(31), Imm(-1)]);
                            self.op("setp.lt.u32", vec![R(has), R(base_col), Imm(i64::from(seg - lanes * v))]);
                        } else {
                            self.op("shfl.sync.up.b32", vec![R(got), R(src), Imm(i64::from(lanes)), Imm(0), Imm(-1)]);
                            self.op("setp.ge.u32", vec![R(has), R(base_col), Imm(i64::from(lanes * v))]);
                        }
                        self.op("selp.f32", vec![R(g), R(got), R(fill), R(has)]);
                    }
                    shuffled.push(((slot.dr, segment), g));
                    g
                }
            };
            self.op("mov.f32", vec![R(r), R(got)]);
            regs.push(r);
        }
        TileVal { ty: t.ty, layout: to, regs }
    }

    /// After a scan step: `updated`'s registers in the slots the step touches, `old`'s in the
    /// others, both in the blocked layout.
    fn scan_pick(&mut self, updated: TileVal, old: TileVal, step: ScanStep) -> TileVal {
        use Operand::Reg as R;
        let to = Layout::blocked(old.ty.rows, old.ty.cols);
        let (u, o) = (self.convert(updated, to), self.convert(old, to));
        let regs = to
            .slots()
            .iter()
            .enumerate()
            .map(|(i, slot)| {
                let r = self.reg(RegClass::F32, "picked");
                let src = if step.touches_slot(slot.dc) { u.regs[i] } else { o.regs[i] };
                self.op("mov.f32", vec![R(r), R(src)]);
                r
            })
            .collect();
        TileVal { ty: o.ty, layout: to, regs }
    }

    /// `t.last_col()` (`last`) or `t.first_col()`. In a blocked layout whose rows lie in one
    /// warp (one warp along the columns), the last (first) lane of each row's lanes holds it in
    /// its last (first) column slot: one `shfl.sync.idx` a row from that lane. Elsewhere,
    /// every other column masked to −∞ and a row maximum.
    fn edge_col(&mut self, t: TileVal, last: bool) -> TileVal {
        use Operand::{Imm, Reg as R};
        let l = t.layout;
        let out = l.reduced(1);
        let slots = l.slots();
        if let LayoutKind::Blocked { v, tc, wc: 1, .. } = l.kind {
            if l.keep_rows && l.keep_cols {
                let (col, src) = (if last { l.parent_cols - l.footprint_cols() + v - 1 } else { 0 }, self.reg(RegClass::B32, "edgelane"));
                if last {
                    self.op("or.b32", vec![R(src), R(self.lane), Imm(i64::from(tc - 1))]);
                } else {
                    self.op("and.b32", vec![R(src), R(self.lane), Imm(i64::from(!(tc - 1) & 31))]);
                }
                let regs = out
                    .slots()
                    .iter()
                    .map(|o| {
                        let i = slots.iter().position(|s| s.dr == o.dr && s.dc == col).expect("a row's edge column slot");
                        let r = self.reg(RegClass::F32, "edge");
                        self.op("shfl.sync.idx.b32", vec![R(r), R(t.regs[i]), R(src), Imm(31), Imm(-1)]);
                        r
                    })
                    .collect();
                return TileVal { ty: TileType { cols: 1, ..t.ty }, layout: out, regs };
            }
        }
        let lr = self.layout_regs(l);
        let regs = slots
            .iter()
            .zip(&t.regs)
            .map(|(slot, &x)| {
                let col = self.reg(RegClass::B32, "col");
                self.op("add.u32", vec![R(col), R(lr.col), Imm(i64::from(slot.dc))]);
                let is_last = self.reg(RegClass::Pred, "islast");
                self.op("setp.eq.u32", vec![R(is_last), R(col), Imm(i64::from(if last { t.ty.cols - 1 } else { 0 }))]);
                let r = self.reg(RegClass::F32, "masked");
                self.op("selp.f32", vec![R(r), R(x), Operand::F32(f32::NEG_INFINITY), R(is_last)]);
                r
            })
            .collect();
        self.reduce(TileVal { ty: t.ty, layout: l, regs }, ReduceOp::Max, 1)
    }

    /// The shared address of this thread's base element in a row-major `?×cols` scratch tile.
    fn thread_offset(&mut self, l: super::LayoutRegs, cols: u32, es: u32) -> Reg {
        use Operand::{Imm, Reg as R};
        let a = self.reg(RegClass::B32, "saddr");
        self.op("mad.lo.u32", vec![R(a), R(l.row), Imm(i64::from(cols)), R(l.col)]);
        let scratch = self.scratch;
        self.op("mad.lo.u32", vec![R(a), R(a), Imm(i64::from(es)), R(scratch)]);
        a
    }

    /// `block_sum(t)` and kin: every thread's registers through shared memory at
    /// `[warpgroup][thread][register]`, between two barriers of the whole block (the first
    /// keeps the previous exchange's readers ahead of these writes), then each thread combines
    /// the registers of its own position in every warpgroup, in warpgroup order, so that all
    /// warpgroups hold the same bits. The warpgroups' layouts are one, so a thread's partners
    /// hold the same elements.
    fn block_reduce(&mut self, t: TileVal, op: ReduceOp) -> TileVal {
        use Operand::{Addr, Imm, Reg as R};
        let wgs = self.ir.warpgroups;
        if wgs == 1 {
            return t;
        }
        let n = t.regs.len() as u32;
        let per_wg = 128 * n * 4;
        self.xchg_bytes = self.xchg_bytes.max(per_wg * wgs);
        let xchg = match self.xchg {
            Some(x) => x,
            None => {
                let x = self.reg(RegClass::B32, "xchg");
                self.xchg = Some(x);
                x
            }
        };
        let vals: Vec<Reg> = t.regs.iter().map(|&r| self.widen_f32(r, t.ty.dtype)).collect();
        // This thread's column of the exchange: xchg + (t mod 128)·n·4; its warpgroup's row.
        let col = self.reg(RegClass::B32, "xcol");
        self.op("and.b32", vec![R(col), R(self.tid), Imm(127)]);
        self.op("mad.lo.u32", vec![R(col), R(col), Imm(i64::from(n * 4)), R(xchg)]);
        let mine = self.reg(RegClass::B32, "xmine");
        self.op("mad.lo.u32", vec![R(mine), R(self.wg), Imm(i64::from(per_wg)), R(col)]);
        self.op("bar.sync", vec![Imm(0)]);
        for (k, &v) in vals.iter().enumerate() {
            self.op("st.shared.f32", vec![Addr(mine, 4 * k as i64), R(v)]);
        }
        self.op("bar.sync", vec![Imm(0)]);
        let inst = op.f32_inst();
        let regs = (0..n as usize)
            .map(|k| {
                let mut acc: Option<Reg> = None;
                for w in 0..wgs {
                    let x = self.reg(RegClass::F32, "xpart");
                    self.op("ld.shared.f32", vec![R(x), Addr(col, i64::from(w * per_wg) + 4 * k as i64)]);
                    acc = Some(match acc {
                        None => x,
                        Some(a) => {
                            let r = self.reg(RegClass::F32, "red");
                            self.op(inst, vec![R(r), R(a), R(x)]);
                            r
                        }
                    });
                }
                let a = acc.expect("two warpgroups at least");
                self.f32_to(a, t.ty.dtype)
            })
            .collect();
        TileVal { ty: t.ty, layout: t.layout, regs }
    }

    /// Reduces `axis` of a tile (0: down the rows, 1: along each row).
    fn reduce(&mut self, t: TileVal, op: ReduceOp, axis: u32) -> TileVal {
        let mut p = [self.reduce_in_warps(t, op, axis)];
        self.reduce_across_warps(&mut p);
        let [p] = p;
        self.reduce_finish(p)
    }

    /// A reduction down the columns (`axis` 0) whose warps' partials an atomic with the same
    /// combine takes as they are: where `t`'s rows span several warps, each warp's partial (its
    /// lanes reduced, not exchanged across warps) and the threads that hold one (a warp's first
    /// lane row, owning its columns); else the whole reduction and no such threads (its owners).
    pub(crate) fn reduce_per_warp(&mut self, t: TileVal, op: ReduceOp) -> (TileVal, Option<Reg>) {
        let l = t.layout;
        let p = self.reduce_in_warps(t, op, 0);
        if p.done || l.warp_split(0) <= 1 {
            let mut p = [p];
            self.reduce_across_warps(&mut p);
            let [p] = p;
            return (self.reduce_finish(p), None);
        }
        let lr = self.layout_regs(l);
        let writers = self.reg(RegClass::Pred, "warp_writer");
        self.op("setp.eq.and.u32", vec![Operand::Reg(writers), Operand::Reg(lr.lr), Operand::Imm(0), Operand::Reg(lr.col_owner)]);
        (self.reduce_finish(p), Some(writers))
    }

    /// Reduces the tiles of independent `let`s (`let a = row_sum(x); let b = row_sum(y);`)
    /// with one exchange across warps: one pair of barriers for them all.
    pub(crate) fn reduce_many(&mut self, tiles: Vec<(TileVal, ReduceOp, u32)>) -> Vec<TileVal> {
        let mut parts: Vec<Partial> = tiles.into_iter().map(|(t, op, axis)| self.reduce_in_warps(t, op, axis)).collect();
        self.reduce_across_warps(&mut parts);
        parts.into_iter().map(|p| self.reduce_finish(p)).collect()
    }

    /// Steps 1 and 2 of a reduction: within each thread, then across the lanes of each warp.
    fn reduce_in_warps(&mut self, t: TileVal, op: ReduceOp, axis: u32) -> Partial {
        let l = t.layout;
        let out_layout = l.reduced(axis);
        let ty = if axis == 1 { TileType { cols: 1, ..t.ty } } else { TileType { rows: 1, ..t.ty } };
        let kept = if axis == 1 { l.keep_cols } else { l.keep_rows };
        if !kept {
            return Partial { op, axis, layout: l, ty, out_layout, acc: t.regs, done: true };
        }
        let mut acc = self.reduce_in_threads(&t, op, axis);
        let inst = op.f32_inst();
        // 2. Across the lanes of a warp: butterfly over the lane bits of the reduced axis.
        let (lane_lo, lane_n) = l.lane_split(axis);
        let mut step = lane_lo * lane_n / 2;
        while step >= lane_lo && lane_n > 1 {
            for a in acc.iter_mut() {
                *a = self.butterfly(*a, *a, step, inst);
            }
            step /= 2;
        }
        Partial { op, axis, layout: l, ty, out_layout, acc, done: false }
    }

    /// Step 1 of a reduction: within the thread, the registers that share the kept coordinate
    /// combined, one f32 a slot of the reduced layout (replicas zeroed in a sum).
    fn reduce_in_threads(&mut self, t: &TileVal, op: ReduceOp, axis: u32) -> Vec<Reg> {
        use Operand::Reg as R;
        let l = t.layout;
        let out_layout = l.reduced(axis);
        let inst = op.f32_inst();
        let slots = l.slots();
        let mut acc: Vec<Reg> = Vec::new();
        for o in &out_layout.slots() {
            let mut a: Option<Reg> = None;
            for (i, s) in slots.iter().enumerate() {
                let key = if axis == 1 { s.dr == o.dr } else { s.dc == o.dc };
                if !key {
                    continue;
                }
                let x = self.widen_f32(t.regs[i], t.ty.dtype);
                a = Some(match a {
                    None => x,
                    Some(prev) => {
                        let r = self.reg(RegClass::F32, "red");
                        self.op(inst, vec![R(r), R(prev), R(x)]);
                        r
                    }
                });
            }
            acc.push(a.expect("every reduced slot has a parent slot"));
        }
        // Replicas take the operation's identity: they must not count twice in a sum, and a
        // replica need not hold its owner's value — two threads' strong loads of memory that
        // other blocks write (a look-back's published totals) may see it at different times,
        // and a maximum that took the replica's newer value would point at an element whose
        // owner saw the older one.
        let lr = self.layout_regs(l);
        let (replicated, valid) = if axis == 1 { (l.cols_replicated(), lr.col_owner) } else { (l.rows_replicated(), lr.row_owner) };
        if replicated {
            for a in acc.iter_mut() {
                let r = self.reg(RegClass::F32, "red");
                self.op("selp.f32", vec![R(r), R(*a), Operand::F32(op.identity()), R(valid)]);
                *a = r;
            }
        }
        acc
    }

    /// A column reduction for `atomic_add(…, col_sum(t))` (or `col_max` with `atomic_max`) by
    /// a reduce-scatter inside each warp: where each thread holds `k` of the columns and `L`
    /// lane bits run down the rows, the butterfly's first levels halve the values a lane
    /// carries (a lane keeps one half and sends the other to its partner: one shuffle a pair)
    /// instead of exchanging all `k` at every level, so that each lane ends with some of the
    /// columns' warp totals and writes those itself — about `k` shuffles instead of `k·L` (9
    /// instead of 40 for a row of 8 a thread), and no exchange across warps. `Err(t)` where
    /// it saves nothing or does not apply (16-bit values, columns not evenly spaced).
    pub(crate) fn reduce_scatter(&mut self, t: TileVal, op: ReduceOp) -> Result<Scattered, TileVal> {
        use Operand::{Imm, Reg as R};
        let l = t.layout;
        let out_layout = l.reduced(0);
        let offsets: Vec<i64> = out_layout.slots().iter().map(|o| i64::from(o.dc)).collect();
        let k = offsets.len();
        let (lane_lo, lane_n) = l.lane_split(0);
        let spacing = if k >= 2 { offsets[1] - offsets[0] } else { 0 };
        let evenly = offsets.iter().enumerate().all(|(i, &o)| o == offsets[0] + i as i64 * spacing);
        if !l.keep_rows || t.ty.dtype != DType::F32 || k < 2 || !k.is_power_of_two() || lane_n < 2 || !lane_n.is_power_of_two() || !evenly {
            return Err(t);
        }
        let levels = lane_n.trailing_zeros();
        let halving = k.trailing_zeros().min(levels);
        let kept = k >> halving;
        let scatter: usize = (0..halving).map(|i| k >> (i + 1)).sum::<usize>() + (levels - halving) as usize * kept;
        if scatter >= k * levels as usize {
            return Err(t);
        }
        let mut acc = self.reduce_in_threads(&t, op, 0);
        let inst = op.f32_inst();
        // The index (in the reduced layout's slots) of the lane's first kept value.
        let index = self.reg(RegClass::B32, "scatter_index");
        self.op("mov.b32", vec![R(index), Imm(0)]);
        let mut step = lane_lo * lane_n / 2;
        for level in 0..levels {
            if level < halving {
                // Lanes with this bit set keep the upper half and send the lower.
                let (bit, upper) = (self.reg(RegClass::B32, "bit"), self.reg(RegClass::Pred, "upper"));
                self.op("and.b32", vec![R(bit), R(self.lane), Imm(i64::from(step))]);
                self.op("setp.ne.u32", vec![R(upper), R(bit), Imm(0)]);
                let half = acc.len() / 2;
                let mut next = Vec::with_capacity(half);
                for i in 0..half {
                    let (lo, hi) = (acc[i], acc[i + half]);
                    let (send, keep) = (self.reg(RegClass::F32, "send"), self.reg(RegClass::F32, "keep"));
                    self.op("selp.f32", vec![R(send), R(lo), R(hi), R(upper)]);
                    self.op("selp.f32", vec![R(keep), R(hi), R(lo), R(upper)]);
                    next.push(self.butterfly(keep, send, step, inst));
                }
                acc = next;
                let add = self.reg(RegClass::B32, "half");
                self.op("selp.b32", vec![R(add), Imm(half as i64), Imm(0), R(upper)]);
                self.op("add.s32", vec![R(index), R(index), R(add)]);
            } else {
                for a in acc.iter_mut() {
                    *a = self.butterfly(*a, *a, step, inst);
                }
            }
            step /= 2;
        }
        // Writers: the lanes whose bits of the full levels are zero, owning their columns.
        let lr = self.layout_regs(l);
        let writers = self.reg(RegClass::Pred, "scatter_writer");
        let low = (i64::from(lane_lo) << (levels - halving)) - i64::from(lane_lo);
        let bits = self.reg(RegClass::B32, "lowbits");
        self.op("and.b32", vec![R(bits), R(self.lane), Imm(low)]);
        self.op("setp.eq.and.u32", vec![R(writers), R(bits), Imm(0), R(lr.col_owner)]);
        let values = acc
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                let off = self.reg(RegClass::B32, "scatter_col");
                self.op("add.s32", vec![R(off), R(index), Imm(i as i64)]);
                self.op("mul.lo.s32", vec![R(off), R(off), Imm(spacing)]);
                (v, off)
            })
            .collect();
        Ok(Scattered { values, writers, ty: TileType { rows: 1, ..t.ty }, layout: out_layout })
    }

    /// `keep` combined by `inst` with lane `lane ^ step`'s `send` (a butterfly level: both `a`).
    fn butterfly(&mut self, keep: Reg, send: Reg, step: u32, inst: &str) -> Reg {
        use Operand::{Imm, Reg as R};
        let other = self.reg(RegClass::F32, "shfl");
        self.op("shfl.sync.bfly.b32", vec![R(other), R(send), Imm(i64::from(step)), Imm(31), Imm(-1)]);
        let r = self.reg(RegClass::F32, "red");
        self.op(inst, vec![R(r), R(keep), R(other)]);
        r
    }

    /// Step 3: across warps, through shared memory, every partial in one exchange. Each
    /// scratch user starts with a barrier, so none is needed after the reads.
    fn reduce_across_warps(&mut self, parts: &mut [Partial]) {
        use Operand::{Addr, Imm, Reg as R};
        let cross: Vec<usize> = (0..parts.len()).filter(|&i| !parts[i].done && parts[i].layout.warp_split(parts[i].axis) > 1).collect();
        if cross.is_empty() {
            return;
        }
        // Partial k's slots start at `at[k]` bytes: `nwarps × extent` f32s each.
        let mut at = Vec::with_capacity(cross.len());
        let mut bytes = 0;
        for &i in &cross {
            let p = &parts[i];
            at.push(bytes);
            let extent = if p.axis == 1 { p.layout.parent_rows } else { p.layout.parent_cols };
            bytes += p.layout.warp_split(p.axis) * extent * 4;
        }
        self.need_scratch(bytes);
        self.warpgroup_barrier();
        let scratch = self.scratch;
        let mut reads = Vec::with_capacity(cross.len());
        for (&i, &at) in cross.iter().zip(&at) {
            let p = &parts[i];
            let (l, axis) = (p.layout, p.axis);
            let lr = self.layout_regs(l);
            let extent = if axis == 1 { l.parent_rows } else { l.parent_cols };
            let (lane_idx, warp_idx, pos, owner) =
                if axis == 1 { (lr.lc, lr.wc, lr.row, lr.row_owner) } else { (lr.lr, lr.wr, lr.col, lr.col_owner) };
            let offsets: Vec<u32> = p.out_layout.slots().iter().map(|o| if axis == 1 { o.dr } else { o.dc }).collect();
            let writer = self.reg(RegClass::Pred, "writer");
            self.op("setp.eq.and.u32", vec![R(writer), R(lane_idx), Imm(0), R(owner)]);
            // base = scratch + at + (warp_idx * extent + pos) * 4
            let base = self.reg(RegClass::B32, "saddr");
            self.op("mad.lo.u32", vec![R(base), R(warp_idx), Imm(i64::from(extent)), R(pos)]);
            self.op("mad.lo.u32", vec![R(base), R(base), Imm(4), R(scratch)]);
            for (a, &off) in p.acc.iter().zip(&offsets) {
                self.op_if(writer, false, "st.shared.f32", vec![Addr(base, i64::from(at + off * 4)), R(*a)]);
            }
            let rbase = self.reg(RegClass::B32, "saddr");
            self.op("mad.lo.u32", vec![R(rbase), R(pos), Imm(4), R(scratch)]);
            reads.push((rbase, extent, offsets));
        }
        self.warpgroup_barrier();
        for ((&i, &at), (rbase, extent, offsets)) in cross.iter().zip(&at).zip(reads) {
            let (inst, nwarps) = (parts[i].op.f32_inst(), parts[i].layout.warp_split(parts[i].axis));
            for (a, &off) in parts[i].acc.iter_mut().zip(&offsets) {
                let mut total = None;
                for w in 0..nwarps {
                    let x = self.reg(RegClass::F32, "part");
                    let o = i64::from(at + (w * extent + off) * 4);
                    self.op("ld.shared.f32", vec![R(x), Addr(rbase, o)]);
                    total = Some(match total {
                        None => x,
                        Some(t) => {
                            let r = self.reg(RegClass::F32, "red");
                            self.op(inst, vec![R(r), R(t), R(x)]);
                            r
                        }
                    });
                }
                *a = total.unwrap_or(*a);
            }
        }
    }

    /// The reduced tile, in the input's element type.
    fn reduce_finish(&mut self, p: Partial) -> TileVal {
        let regs = if p.done { p.acc } else { p.acc.into_iter().map(|a| self.f32_to(a, p.ty.dtype)).collect() };
        TileVal { ty: p.ty, layout: p.out_layout, regs }
    }
}

/// A warp's column totals after [`Lowerer::reduce_scatter`]: the values a lane holds, each
/// with its column's offset from the reduced tile's first slot (in elements), and which
/// lanes write them.
pub(crate) struct Scattered {
    pub values: Vec<(Reg, Reg)>,
    pub writers: Reg,
    /// The reduced tile's type and layout.
    pub ty: TileType,
    pub layout: Layout,
}

/// A reduction part way: each warp's result, before the exchange across warps.
pub(crate) struct Partial {
    op: ReduceOp,
    axis: u32,
    /// The input's layout.
    layout: Layout,
    /// The result's type and layout.
    ty: TileType,
    out_layout: Layout,
    /// One f32 per result slot (or, when `done`, the result's registers as they are).
    acc: Vec<Reg>,
    /// Nothing to reduce: the axis is not spread over threads.
    done: bool,
}

impl ReduceOp {
    /// The value that leaves the other operand unchanged.
    fn identity(self) -> f32 {
        match self {
            ReduceOp::Sum => 0.0,
            ReduceOp::Max => f32::NEG_INFINITY,
            ReduceOp::Min => f32::INFINITY,
        }
    }

    fn f32_inst(self) -> &'static str {
        match self {
            ReduceOp::Sum => "add.f32",
            ReduceOp::Max => "max.f32",
            ReduceOp::Min => "min.f32",
        }
    }
}

/// `t.swap_pairs()`: each register takes the one of the column next to it in its pair, which
/// the same thread holds (runs of columns start at even columns).
fn swap_pairs(t: TileVal) -> TileVal {
    let slots = t.layout.slots();
    let regs = slots
        .iter()
        .map(|s| {
            let partner = slots.iter().position(|o| o.dr == s.dr && o.dc == (s.dc ^ 1)).expect("a run holds both columns of a pair");
            t.regs[partner]
        })
        .collect();
    TileVal { regs, ..t }
}

/// Whether a tile expression is an index tile computed from nothing but `row_index()` /
/// `col_index()`, scalars of plain arithmetic, and the `deferred` such tiles: cheap to compute
/// again in whatever layout a use needs.
pub(crate) fn index_like(e: &Expr, deferred: &[(String, std::rc::Rc<Expr>)]) -> bool {
    fn plain_scalar(e: &Expr) -> bool {
        match &e.kind {
            ExprKind::Var(_) | ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) => true,
            ExprKind::Binary(_, x, y) => plain_scalar(x) && plain_scalar(y),
            ExprKind::Unary(_, x) | ExprKind::Cast { value: x, .. } => plain_scalar(x),
            _ => false,
        }
    }
    let tile = |x: &Expr| matches!(x.checked_ty(), Type::Tile(_));
    match &e.kind {
        ExprKind::Iota { .. } => true,
        ExprKind::Var(n) => tile(e) && deferred.iter().any(|(d, _)| d == n),
        ExprKind::Unary(_, value) => tile(value) && index_like(value, deferred),
        ExprKind::Binary(_, x, y) => match (tile(x), tile(y)) {
            (true, true) => index_like(x, deferred) && index_like(y, deferred),
            (true, false) => index_like(x, deferred) && plain_scalar(y),
            (false, true) => plain_scalar(x) && index_like(y, deferred),
            (false, false) => false,
        },
        _ => false,
    }
}

/// What [`Lowerer::index_tile`] has computed: elements by (expression, row, column) — the
/// row or column `u32::MAX` where the expression does not depend on it — and scalars by
/// expression.
#[derive(Default)]
struct IndexMemo {
    elems: std::collections::HashMap<(usize, u32, u32), Reg>,
    scalars: std::collections::HashMap<usize, Reg>,
    /// Rows and columns as f32, by offset from the thread's first.
    rows: std::collections::HashMap<u32, Reg>,
    cols: std::collections::HashMap<u32, Reg>,
    /// An affine expression's part of its row and scalars, by (expression, row).
    row_parts: std::collections::HashMap<(usize, u32), Reg>,
}

/// An index tile as `row·r + col·c + Σ ± scalars` ([`affine`]).
struct Affine {
    row: i64,
    col: i64,
    scalars: Vec<(bool, Expr)>,
}

/// `e` as an [`Affine`] sum, if it is one: sums and differences of `row_index()`,
/// `col_index()` (of tiles whose rows, columns they count), negations, and plain scalars, one
/// of them at least not a literal.
fn affine(e: &Expr, deferred: &[(String, std::rc::Rc<Expr>)]) -> Option<Affine> {
    fn walk(e: &Expr, deferred: &[(String, std::rc::Rc<Expr>)], sign: i64, f: &mut Affine) -> bool {
        match &e.kind {
            _ if !matches!(e.checked_ty(), Type::Tile(_)) => {
                f.scalars.push((sign < 0, e.clone()));
                true
            }
            ExprKind::Iota { axis: 0, tile } => {
                f.row += if tile.rows > 1 { sign } else { 0 };
                true
            }
            ExprKind::Iota { tile, .. } => {
                f.col += if tile.cols > 1 { sign } else { 0 };
                true
            }
            ExprKind::Var(n) => deferred.iter().rev().find(|(d, _)| d == n).is_some_and(|(_, v)| walk(v, deferred, sign, f)),
            ExprKind::Unary(UnOp::Neg, x) => walk(x, deferred, -sign, f),
            ExprKind::Binary(BinOp::Add, x, y) => walk(x, deferred, sign, f) && walk(y, deferred, sign, f),
            ExprKind::Binary(BinOp::Sub, x, y) => walk(x, deferred, sign, f) && walk(y, deferred, -sign, f),
            _ => false,
        }
    }
    let mut f = Affine { row: 0, col: 0, scalars: Vec::new() };
    // Only with a scalar that names something (`k0`, a block's first key): one of literals
    // alone is the same in every iteration of a loop around it, and ptxas would hoist each
    // element's value out of the loop and hold them all (a register an element).
    (walk(e, deferred, 1, &mut f) && f.scalars.iter().any(|(_, x)| !literal(x))).then_some(f)
}

/// Whether an index tile's elements depend on their row, their column.
fn index_deps(e: &Expr, deferred: &[(String, std::rc::Rc<Expr>)]) -> (bool, bool) {
    match &e.kind {
        ExprKind::Iota { axis, tile } => (*axis == 0 && tile.rows > 1, *axis == 1 && tile.cols > 1),
        ExprKind::Var(n) => deferred.iter().rev().find(|(d, _)| d == n).map_or((false, false), |(_, v)| index_deps(v, deferred)),
        ExprKind::Unary(_, x) => index_deps(x, deferred),
        ExprKind::Binary(_, x, y) => {
            let (a, b) = (index_deps(x, deferred), index_deps(y, deferred));
            (a.0 || b.0, a.1 || b.1)
        }
        _ => (false, false),
    }
}

/// Whether an index tile ([`index_like`]) is lowered element by element where it is used: one
/// that reads a named scalar (a block's first key, say). One of literals alone is the same in
/// every iteration of any loop around it, and its elements computed one by one beside their use
/// are values ptxas hoists out of the loop and holds (the linear attention's backward spilled
/// four times as much); as whole tiles, it keeps them as before.
pub(crate) fn per_element(e: &Expr, deferred: &[(String, std::rc::Rc<Expr>)]) -> bool {
    fn names(e: &Expr, deferred: &[(String, std::rc::Rc<Expr>)]) -> bool {
        match &e.kind {
            ExprKind::Var(n) => match deferred.iter().rev().find(|(d, _)| d == n) {
                Some((_, v)) => names(v, deferred),
                None => true,
            },
            _ => e.children().iter().any(|c| names(c, deferred)),
        }
    }
    index_like(e, deferred) && names(e, deferred)
}

/// Whether a scalar expression is made of literals alone.
fn literal(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) => true,
        ExprKind::Binary(_, x, y) => literal(x) && literal(y),
        ExprKind::Unary(_, x) | ExprKind::Cast { value: x, .. } => literal(x),
        _ => false,
    }
}

/// Whether an expression's layout is decided by its use: a load or a constructor, under
/// casts, unary functions, scalar factors and elementwise operations between such tiles of
/// one shape.
pub(crate) fn layout_free(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Load { .. } | ExprKind::SmemLoad(_) | ExprKind::Full { .. } | ExprKind::Iota { .. } | ExprKind::Uniform { .. } => true,
        ExprKind::Cast { value, .. } | ExprKind::Unary(_, value) => layout_free(value),
        ExprKind::Binary(_, x, y) => match (x.checked_ty(), y.checked_ty()) {
            (Type::Tile(_), Type::Scalar(_)) => layout_free(x),
            (Type::Scalar(_), Type::Tile(_)) => layout_free(y),
            // The first operand takes the hint, the second the first's layout.
            (Type::Tile(a), Type::Tile(b)) if a.rows == b.rows && a.cols == b.cols => layout_free(x) && layout_free(y),
            // A broadcast (`zeros + row`): the full-shaped operand takes the hint, the vector
            // moves into its broadcast layout.
            (Type::Tile(a), Type::Tile(b)) if a.rows >= b.rows && a.cols >= b.cols => layout_free(x),
            (Type::Tile(_), Type::Tile(_)) => layout_free(y),
            _ => false,
        },
        _ => false,
    }
}

/// Whether `t.shift_cols(by, …)` can move in one warp's lanes — an f32 tile in a blocked layout
/// whose runs of `v` columns, one a lane, cover each row once in one warp, shifted by less than
/// a run or by whole runs — and if so its layout, `v` and the lanes of a row (`tc`).
fn in_warp_shift(t: &TileVal, axis: u32, by: u32) -> Option<(Layout, u32, u32)> {
    let l = t.layout;
    let LayoutKind::Blocked { v, tc, wc: 1, .. } = l.kind else { return None };
    let n = l.parent_cols;
    let fits = axis == 1
        && l.keep_rows
        && l.keep_cols
        && v.is_power_of_two()
        && tc.is_power_of_two()
        && n == v * tc
        && by > 0
        && by < n
        && (by < v || by.is_multiple_of(v))
        && t.ty.dtype == DType::F32;
    fits.then_some((l, v, tc))
}
