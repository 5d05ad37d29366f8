//! Tile loads from and stores to global memory, with bounds masks.
//!
//! A tile's origin is one index per tensor dimension. For rank ≥ 2 the tile's rows and
//! columns run along the last two dimensions; for rank 1, along the one dimension (the tile is
//! a row or a column). An element outside the tensor reads as the fill value and is never
//! written. Indices compare unsigned, so a negative index is out of bounds too.

use super::{elem_class, GlobalVal, Lowerer, TileVal};
use crate::layout::Layout;
use crate::tirh::TileType;
use crate::tirt::{Operand, Reg, RegClass};

/// Per-thread addresses and predicates of a tile access.
struct Access {
    /// One per slot: the element's address and whether it is in bounds.
    elems: Vec<(Reg, Reg)>,
    /// Runs of consecutive columns that may move as 16-byte (or 8-byte) vectors.
    runs: Vec<Run>,
    /// Bytes per vector access.
    chunk_bytes: u32,
}

/// A thread's run of `layout.run_len()` consecutive columns in one row.
struct Run {
    /// Its first slot.
    first: usize,
    /// True when the whole run is in bounds, the column stride is 1 and the address is
    /// aligned: then it moves as vectors, otherwise element by element.
    vector: Reg,
    /// The negation of `vector`.
    scalar: Reg,
}

impl Lowerer<'_> {
    /// Loads a tile with origin `idx`; out-of-bounds elements take `fill`.
    pub(crate) fn load(&mut self, g: &GlobalVal, idx: &[Operand], ty: TileType, fill: Operand) -> TileVal {
        let layout = Layout::blocked(ty.rows, ty.cols);
        let acc = self.access(g, idx, layout, ty, false);
        let es = ty.dtype.size() * 8;
        let ld = if g.written { "ld.global" } else { "ld.global.nc" };
        let regs: Vec<Reg> = acc
            .elems
            .iter()
            .map(|_| {
                let r = self.reg(elem_class(ty.dtype), &g.name);
                self.op(super::mov_for(r.class), vec![Operand::Reg(r), fill.clone()]);
                r
            })
            .collect();
        for run in &acc.runs {
            self.vector_move(&acc, run, &regs[run.first..run.first + layout.run_len() as usize], ty, ld, true);
        }
        for (i, &(addr, p)) in acc.elems.iter().enumerate() {
            let p = self.scalar_pred(&acc, i, p, layout);
            self.op_if(p, false, &format!("{ld}.b{es}"), vec![Operand::Reg(regs[i]), Operand::Addr(addr, 0)]);
        }
        TileVal { ty, layout, regs }
    }

    /// Stores a tile at origin `idx`; each element is written once, by its owner, if in bounds.
    pub(crate) fn store(&mut self, g: &GlobalVal, idx: &[Operand], t: &TileVal) {
        let acc = self.access(g, idx, t.layout, t.ty, true);
        let es = t.ty.dtype.size() * 8;
        for run in &acc.runs {
            self.vector_move(&acc, run, &t.regs[run.first..run.first + t.layout.run_len() as usize], t.ty, "st.global", false);
        }
        for (i, (&(addr, p), &r)) in acc.elems.iter().zip(&t.regs).enumerate() {
            let p = self.scalar_pred(&acc, i, p, t.layout);
            self.op_if(p, false, &format!("st.global.b{es}"), vec![Operand::Addr(addr, 0), Operand::Reg(r)]);
        }
    }

    /// The predicate of element `i`'s scalar access: in bounds, and not moved by its run's
    /// vector access.
    fn scalar_pred(&mut self, acc: &Access, i: usize, inb: Reg, layout: Layout) -> Reg {
        let Some(run) = acc.runs.get(i / layout.run_len() as usize) else { return inb };
        let p = self.reg(RegClass::Pred, "scalar");
        self.op("and.pred", vec![Operand::Reg(p), Operand::Reg(inb), Operand::Reg(run.scalar)]);
        p
    }

    /// Moves one run of registers with vector loads (`load`) or stores, guarded by the run's
    /// vector predicate. 16-bit elements travel in pairs packed into b32 lanes.
    fn vector_move(&mut self, acc: &Access, run: &Run, regs: &[Reg], ty: TileType, op: &str, load: bool) {
        use Operand::{Reg as R, Vec as V};
        let addr = acc.elems[run.first].0;
        let per_chunk = (acc.chunk_bytes / ty.dtype.size()) as usize;
        for (c, chunk) in regs.chunks(per_chunk).enumerate() {
            let off = i64::from(acc.chunk_bytes) * c as i64;
            let lanes = (acc.chunk_bytes / 4) as usize;
            let vop = if lanes == 1 { format!("{op}.b32") } else { format!("{op}.v{lanes}.b32") };
            if ty.dtype.size() == 4 {
                let args = if load {
                    vec![V(chunk.to_vec()), Operand::Addr(addr, off)]
                } else {
                    vec![Operand::Addr(addr, off), V(chunk.to_vec())]
                };
                self.op_if(run.vector, false, &format!("{op}.v{lanes}.b32"), args);
                continue;
            }
            let words: Vec<Reg> = (0..lanes).map(|_| self.reg(RegClass::B32, "pack")).collect();
            if load {
                let dst = if lanes == 1 { R(words[0]) } else { V(words.clone()) };
                self.op_if(run.vector, false, &vop, vec![dst, Operand::Addr(addr, off)]);
                for (w, pair) in words.iter().zip(chunk.chunks(2)) {
                    self.op_if(run.vector, false, "mov.b32", vec![V(pair.to_vec()), R(*w)]);
                }
            } else {
                for (w, pair) in words.iter().zip(chunk.chunks(2)) {
                    self.op("mov.b32", vec![R(*w), V(pair.to_vec())]);
                }
                let src = if lanes == 1 { R(words[0]) } else { V(words) };
                self.op_if(run.vector, false, &vop, vec![Operand::Addr(addr, off), src]);
            }
        }
    }

    fn access(&mut self, g: &GlobalVal, idx: &[Operand], layout: Layout, ty: TileType, owners_only: bool) -> Access {
        use Operand::{Imm, Reg as R};
        let rank = g.dims.len();
        let es = i64::from(ty.dtype.size());
        let lr = self.layout_regs(layout);
        // Which tensor axis the tile's rows and columns run along.
        let (row_axis, col_axis) = if rank >= 2 {
            (Some(rank - 2), Some(rank - 1))
        } else if ty.cols == 1 {
            (Some(0), None)
        } else {
            (None, Some(0))
        };
        // The uniform part: leading indices and their bounds.
        let base = self.reg(RegClass::B64, "base");
        self.op("mov.b64", vec![R(base), R(g.ptr)]);
        let inb = self.reg(RegClass::Pred, "inb");
        let owner = if owners_only { layout_owner(lr.owner) } else { None };
        match owner {
            Some(o) => self.op("mov.pred", vec![R(inb), R(o)]),
            None => self.op("setp.eq.u32", vec![R(inb), R(self.lane), R(self.lane)]),
        }
        for (k, i) in idx.iter().enumerate() {
            if Some(k) == row_axis || Some(k) == col_axis {
                continue;
            }
            let i = i.clone();
            let ir = self.reg(RegClass::B32, "idx");
            self.op("mov.b32", vec![R(ir), i]);
            self.op("setp.lt.and.u32", vec![R(inb), R(ir), R(g.dims[k]), R(inb)]);
            self.term(base, ir, g.strides[k], es);
        }
        // Per distinct row offset and column offset: the coordinate, its bound, its address term.
        let axis_terms = |lw: &mut Self, axis: Option<usize>, thread: Reg, offsets: Vec<u32>, hint: &str| -> Vec<(Reg, Reg)> {
            offsets
                .iter()
                .map(|&off| {
                    let off_reg = lw.reg(RegClass::B64, hint);
                    let p = lw.reg(RegClass::Pred, hint);
                    match axis {
                        Some(a) => {
                            let c = lw.reg(RegClass::B32, hint);
                            lw.op("add.s32", vec![R(c), R(thread), idx[a].clone()]);
                            if off > 0 {
                                lw.op("add.s32", vec![R(c), R(c), Imm(i64::from(off))]);
                            }
                            lw.op("setp.lt.u32", vec![R(p), R(c), R(g.dims[a])]);
                            lw.op("mov.b64", vec![R(off_reg), Imm(0)]);
                            lw.term(off_reg, c, g.strides[a], es);
                        }
                        None => {
                            lw.op("mov.b64", vec![R(off_reg), Imm(0)]);
                            let lane = lw.lane;
                            lw.op("setp.eq.u32", vec![R(p), R(lane), R(lane)]);
                        }
                    }
                    (off_reg, p)
                })
                .collect()
        };
        let slots = layout.slots();
        let mut row_offs: Vec<u32> = Vec::new();
        let mut col_offs: Vec<u32> = Vec::new();
        for sl in &slots {
            if !row_offs.contains(&sl.dr) {
                row_offs.push(sl.dr);
            }
            if !col_offs.contains(&sl.dc) {
                col_offs.push(sl.dc);
            }
        }
        let rows = axis_terms(self, row_axis, lr.row, row_offs.clone(), "r");
        let cols = axis_terms(self, col_axis, lr.col, col_offs.clone(), "c");
        let mut row_addr = Vec::new();
        for &(off, p) in &rows {
            let a = self.reg(RegClass::B64, "rowaddr");
            self.op("add.s64", vec![R(a), R(base), R(off)]);
            let q = self.reg(RegClass::Pred, "rowin");
            self.op("and.pred", vec![R(q), R(p), R(inb)]);
            row_addr.push((a, q));
        }
        let mut elems = Vec::new();
        for sl in &slots {
            let ri = row_offs.iter().position(|&d| d == sl.dr).unwrap_or(0);
            let ci = col_offs.iter().position(|&d| d == sl.dc).unwrap_or(0);
            let ((ra, rp), (co, cp)) = (row_addr[ri], cols[ci]);
            let a = self.reg(RegClass::B64, "addr");
            self.op("add.s64", vec![R(a), R(ra), R(co)]);
            let p = self.reg(RegClass::Pred, "in");
            self.op("and.pred", vec![R(p), R(rp), R(cp)]);
            elems.push((a, p));
        }
        let run_bytes = layout.run_len() * ty.dtype.size();
        let chunk_bytes = run_bytes.min(16);
        let mut runs = Vec::new();
        if let (Some(ca), true) = (col_axis, layout.run_len() > 1 && run_bytes >= 4) {
            let unit = self.reg(RegClass::Pred, "unit_stride");
            self.op("setp.eq.u32", vec![R(unit), R(g.strides[ca]), Imm(1)]);
            let v = layout.run_len() as usize;
            for first in (0..elems.len()).step_by(v) {
                let (addr, p_first) = elems[first];
                let p_last = elems[first + v - 1].1;
                let low = self.reg(RegClass::B32, "align");
                self.op("cvt.u32.u64", vec![R(low), R(addr)]);
                self.op("and.b32", vec![R(low), R(low), Imm(i64::from(chunk_bytes - 1))]);
                let vector = self.reg(RegClass::Pred, "vec");
                self.op("setp.eq.and.u32", vec![R(vector), R(low), Imm(0), R(unit)]);
                self.op("and.pred", vec![R(vector), R(vector), R(p_first)]);
                self.op("and.pred", vec![R(vector), R(vector), R(p_last)]);
                let scalar = self.reg(RegClass::Pred, "novec");
                self.op("not.pred", vec![R(scalar), R(vector)]);
                runs.push(Run { first, vector, scalar });
            }
        }
        Access { elems, runs, chunk_bytes }
    }

    /// `acc += (s64)index * stride * es`
    fn term(&mut self, acc: Reg, index: Reg, stride: Reg, es: i64) {
        use Operand::{Imm, Reg as R};
        let sb = self.reg(RegClass::B32, "sbytes");
        self.op("mul.lo.s32", vec![R(sb), R(stride), Imm(es)]);
        let t = self.reg(RegClass::B64, "term");
        self.op("mul.wide.s32", vec![R(t), R(index), R(sb)]);
        self.op("add.s64", vec![R(acc), R(acc), R(t)]);
    }
}

fn layout_owner(owner: Reg) -> Option<Reg> {
    Some(owner)
}
