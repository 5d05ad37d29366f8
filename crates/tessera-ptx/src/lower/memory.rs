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
}

impl Lowerer<'_> {
    /// Loads a tile with origin `idx`; out-of-bounds elements take `fill`.
    pub(crate) fn load(&mut self, g: &GlobalVal, idx: &[Operand], ty: TileType, fill: Operand) -> TileVal {
        let layout = Layout::blocked(ty.rows, ty.cols);
        let acc = self.access(g, idx, layout, ty, false);
        let es = ty.dtype.size() * 8;
        let regs = acc
            .elems
            .iter()
            .map(|&(addr, p)| {
                let r = self.reg(elem_class(ty.dtype), &g.name);
                self.op(super::mov_for(r.class), vec![Operand::Reg(r), fill.clone()]);
                self.op_if(p, false, &format!("ld.global.b{es}"), vec![Operand::Reg(r), Operand::Addr(addr, 0)]);
                r
            })
            .collect();
        TileVal { ty, layout, regs }
    }

    /// Stores a tile at origin `idx`; each element is written once, by its owner, if in bounds.
    pub(crate) fn store(&mut self, g: &GlobalVal, idx: &[Operand], t: &TileVal) {
        let acc = self.access(g, idx, t.layout, t.ty, true);
        let es = t.ty.dtype.size() * 8;
        for (&(addr, p), &r) in acc.elems.iter().zip(&t.regs) {
            self.op_if(p, false, &format!("st.global.b{es}"), vec![Operand::Addr(addr, 0), Operand::Reg(r)]);
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
        let rows = axis_terms(self, row_axis, lr.row, layout.row_offsets(), "r");
        let cols = axis_terms(self, col_axis, lr.col, layout.col_offsets(), "c");
        let mut row_addr = Vec::new();
        for &(off, p) in &rows {
            let a = self.reg(RegClass::B64, "rowaddr");
            self.op("add.s64", vec![R(a), R(base), R(off)]);
            let q = self.reg(RegClass::Pred, "rowin");
            self.op("and.pred", vec![R(q), R(p), R(inb)]);
            row_addr.push((a, q));
        }
        let mut elems = Vec::new();
        for &(ra, rp) in &row_addr {
            for &(co, cp) in &cols {
                let a = self.reg(RegClass::B64, "addr");
                self.op("add.s64", vec![R(a), R(ra), R(co)]);
                let p = self.reg(RegClass::Pred, "in");
                self.op("and.pred", vec![R(p), R(rp), R(cp)]);
                elems.push((a, p));
            }
        }
        Access { elems }
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
