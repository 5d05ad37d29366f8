//! Tile loads from and stores to global memory, with bounds masks.
//!
//! A tile's origin is one index per tensor dimension. For rank ≥ 2 the tile's rows and
//! columns run along the last two dimensions; for rank 1, along the one dimension (the tile is
//! a row or a column). An element outside the tensor reads as the fill value and is never
//! written. Indices compare unsigned, so a negative index is out of bounds too.
//!
//! Accesses stream: a few per-row terms are computed first, then each run of consecutive
//! columns gets its address and predicate just before it moves, so that a 64×256 accumulator's
//! store does not hold 128 addresses at once. A run moves as one vector (up to 16 bytes) when
//! it is in bounds, the column stride is 1 and the address is aligned; otherwise element by
//! element.

use super::{elem_class, GlobalVal, Lowerer, TileVal};
use crate::layout::Layout;
use crate::tirh::TileType;
use crate::tirt::{Operand, Reg, RegClass};

/// What every element of an access shares.
struct Plan {
    /// Per distinct row offset: the row's address (`base + row·stride`), the address of the
    /// thread's first column in that row if the column stride is 1, and whether the row is in
    /// bounds (with the leading indices and, for stores, ownership).
    rows: Vec<(u32, Reg, Reg, Reg)>,
    /// The thread's first column coordinate, or `None` when the tile has no column axis.
    col0: Option<Reg>,
    /// The column bound and stride in bytes.
    col_dim: Option<Reg>,
    col_stride_bytes: Option<Reg>,
    /// Whether the column stride is 1.
    unit: Option<Reg>,
    /// The row stride in bytes (for the fast path's alignment check).
    row_stride_bytes: Option<Reg>,
}

impl Lowerer<'_> {
    /// Loads a tile with origin `idx`; out-of-bounds elements take `fill`.
    pub(crate) fn load(&mut self, g: &GlobalVal, idx: &[Operand], ty: TileType, fill: Operand, layout: Layout) -> TileVal {
        let ld = if g.written { "ld.global" } else { "ld.global.nc" };
        let (regs, packs) = self.load_regs(g, ty, &fill, layout);
        let plan = self.plan(g, idx, layout, ty, false);
        self.stream(&plan, layout, ty, &regs, packs.as_deref(), ld, true);
        self.unpack(&regs, packs.as_deref());
        TileVal { ty, layout, regs }
    }

    /// A loaded tile's registers, set to `fill`; for 16-bit elements moved in pairs, also the
    /// b32 words that carry the pairs (set to the filled pairs). The loads write the words on
    /// every path and the pairs are unpacked once, after the paths join, so that only the
    /// words are live at the join: unpacked at each vector, a 1×8192 bf16 tile held 64
    /// registers of halves there where 32 words do (ptxas gives a 16-bit value a register).
    fn load_regs(&mut self, g: &GlobalVal, ty: TileType, fill: &Operand, layout: Layout) -> (Vec<Reg>, Option<Vec<Reg>>) {
        use Operand::Reg as R;
        let regs: Vec<Reg> = (0..layout.len()).map(|_| self.reg(elem_class(ty.dtype), &g.name)).collect();
        let paired = ty.dtype.size() == 2 && layout.run_len() >= 2 && layout.run_len().is_multiple_of(2);
        if !paired {
            for &r in &regs {
                self.op(super::mov_for(r.class), vec![R(r), fill.clone()]);
            }
            return (regs, None);
        }
        let half = self.reg(elem_class(ty.dtype), "fill");
        self.op(super::mov_for(half.class), vec![R(half), fill.clone()]);
        let pair = self.reg(RegClass::B32, "fill2");
        self.pack(&[half, half], Some(&[pair]));
        let packs: Vec<Reg> = (0..regs.len() / 2)
            .map(|_| {
                let w = self.reg(RegClass::B32, "pack");
                self.op("mov.b32", vec![R(w), R(pair)]);
                w
            })
            .collect();
        (regs, Some(packs))
    }

    /// Unpacks b32 words into the 16-bit register pairs they carry (nothing without words).
    fn unpack(&mut self, regs: &[Reg], packs: Option<&[Reg]>) {
        use Operand::{Reg as R, Vec as V};
        for (w, pair) in packs.unwrap_or_default().iter().zip(regs.chunks(2)) {
            self.op("mov.b32", vec![V(pair.to_vec()), R(*w)]);
        }
    }

    /// Packs 16-bit register pairs into b32 words (nothing without words).
    fn pack(&mut self, regs: &[Reg], packs: Option<&[Reg]>) {
        use Operand::{Reg as R, Vec as V};
        for (w, pair) in packs.unwrap_or_default().iter().zip(regs.chunks(2)) {
            self.op("mov.b32", vec![R(*w), V(pair.to_vec())]);
        }
    }

    /// Packs 16-bit registers into b32 words: pairs of 16-bit elements (`es` 2), or four fp8
    /// codes, each from the low byte of its register (`es` 1).
    fn pack_words(&mut self, regs: &[Reg], words: &[Reg], es: u32) {
        use Operand::{Imm, Reg as R, Vec as V};
        if es == 2 {
            return self.pack(regs, Some(words));
        }
        for (w, four) in words.iter().zip(regs.chunks(4)) {
            // {a, b} and {c, d} as halves; the low byte of each half, in order.
            let (x, y) = (self.reg(RegClass::B32, "ab"), self.reg(RegClass::B32, "cd"));
            self.op("mov.b32", vec![R(x), V(four[..2].to_vec())]);
            self.op("mov.b32", vec![R(y), V(four[2..].to_vec())]);
            self.op("prmt.b32", vec![R(*w), R(x), R(y), Imm(0x6420)]);
        }
    }

    /// Unpacks b32 words into the 16-bit registers they carry ([`Self::pack_words`]'s inverse;
    /// an fp8 code lands in the low byte of its register, the high byte 0).
    fn unpack_words(&mut self, regs: &[Reg], words: &[Reg], es: u32) {
        use Operand::{Imm, Reg as R, Vec as V};
        if es == 2 {
            return self.unpack(regs, Some(words));
        }
        let zero = self.reg(RegClass::B32, "zero");
        self.op("mov.b32", vec![R(zero), Imm(0)]);
        for (w, four) in words.iter().zip(regs.chunks(4)) {
            for (half, sel) in four.chunks(2).zip([0x4140, 0x4342]) {
                let x = self.reg(RegClass::B32, "bytes");
                self.op("prmt.b32", vec![R(x), R(*w), R(zero), Imm(sel)]);
                self.op("mov.b32", vec![V(half.to_vec()), R(x)]);
            }
        }
    }

    /// Loads several tiles at once: where every one of them takes the fast path, all their
    /// vectors go out in one straight run, so that none waits for another's data (a branch per
    /// tile would make each wait at its join); else each tile by its own paths.
    pub(crate) fn load_group(&mut self, loads: Vec<(GlobalVal, Vec<Operand>, TileType, Operand, Layout)>) -> Vec<TileVal> {
        use Operand::{Reg as R, Sym};
        let mut prepared = Vec::with_capacity(loads.len());
        for (g, idx, ty, fill, layout) in loads {
            let ld = if g.written { "ld.global" } else { "ld.global.nc" };
            let (regs, packs) = self.load_regs(&g, ty, &fill, layout);
            let plan = self.plan(&g, &idx, layout, ty, false);
            let fast = self.fast_path(&plan, layout, ty);
            prepared.push((plan, layout, ty, regs, packs, ld, fast));
        }
        if prepared.iter().all(|p| p.6.is_some()) {
            let all = self.reg(RegClass::Pred, "allin");
            self.op("setp.eq.u32", vec![R(all), R(self.lane), R(self.lane)]);
            for p in &prepared {
                let (_, all_in, _) = p.6.expect("checked");
                self.op("and.pred", vec![R(all), R(all), R(all_in)]);
            }
            let (each, done) = (self.label("each"), self.label("loaded"));
            self.op_if(all, true, "bra", vec![Sym(each.clone())]);
            for (plan, layout, ty, regs, packs, ld, fast) in &prepared {
                let (_, _, chunk) = fast.expect("checked");
                self.vector_runs(plan, *layout, None, *ty, regs, packs.as_deref(), ld, true, chunk);
            }
            self.op("bra", vec![Sym(done.clone())]);
            self.body.push(crate::tirt::Inst::Label(each));
            for (plan, layout, ty, regs, packs, ld, _) in &prepared {
                self.stream(plan, *layout, *ty, regs, packs.as_deref(), ld, true);
            }
            self.body.push(crate::tirt::Inst::Label(done));
        } else {
            for (plan, layout, ty, regs, packs, ld, _) in &prepared {
                self.stream(plan, *layout, *ty, regs, packs.as_deref(), ld, true);
            }
        }
        for (_, _, _, regs, packs, _, _) in &prepared {
            self.unpack(regs, packs.as_deref());
        }
        prepared.into_iter().map(|(_, layout, ty, regs, _, _, _)| TileVal { ty, layout, regs }).collect()
    }

    /// `prefetch.global.L2` for each run of the tile (blocked layout) whose first element is
    /// in bounds: the lines arrive in L2 while the kernel works on, holding no registers.
    pub(crate) fn prefetch(&mut self, g: &GlobalVal, idx: &[Operand], ty: TileType, layout: Layout) {
        let plan = self.plan(g, idx, layout, ty, false);
        let es = ty.dtype.size();
        let (slots, run) = (layout.slots(), layout.run_len().max(1) as usize);
        // One prefetch per 16 bytes of a run at most; 128-byte lines make more redundant.
        let step = ((16 / es) as usize).clamp(1, run);
        for i in (0..slots.len()).step_by(step) {
            let sl = slots[i];
            let &(_, row_addr, _, row_in) = plan.rows.iter().find(|r| r.0 == sl.dr).expect("planned row");
            let (addr, p) = match (plan.col0, plan.col_dim, plan.col_stride_bytes) {
                (Some(c0), Some(dim), Some(sb)) => self.element_addr(row_addr, row_in, (c0, dim, sb), sl.dc),
                _ => (row_addr, row_in),
            };
            self.op_if(p, false, "prefetch.global.L2", vec![Operand::Addr(addr, 0)]);
        }
    }

    /// `atomic_add`: each element, by its owner, if in bounds, added with `red.global.add.f32`;
    /// `max` (`atomic_max`): on the f32 bits, `red.max.s32` where the value is ≥ +0 (such bits
    /// order as the floats do, and above every negative float's), `red.min.u32` below (a
    /// negative float's bits order backwards, and above every positive one's).
    /// `writers`, where given, names the threads that issue them instead of the layout's owners
    /// (each warp's partial of a column reduction: [`Self::reduce_per_warp`]).
    pub(crate) fn atomic_add(&mut self, g: &GlobalVal, idx: &[Operand], t: &TileVal, max: bool, writers: Option<Reg>) {
        let plan = self.plan_for(g, idx, t.layout, t.ty, true, writers);
        for (sl, &r) in t.layout.slots().iter().zip(&t.regs) {
            let &(_, row_addr, _, row_in) = plan.rows.iter().find(|p| p.0 == sl.dr).expect("planned row");
            let (addr, p) = match (plan.col0, plan.col_dim, plan.col_stride_bytes) {
                (Some(c0), Some(dim), Some(sb)) => self.element_addr(row_addr, row_in, (c0, dim, sb), sl.dc),
                _ => (row_addr, row_in),
            };
            self.red(addr, p, r, max);
        }
    }

    /// `atomic_add` (`atomic_max` with `max`) of a warp's column totals scattered over its lanes
    /// ([`Self::reduce_scatter`]): each value at the tile's first slot moved by its column offset.
    pub(crate) fn atomic_add_scattered(&mut self, g: &GlobalVal, idx: &[Operand], sc: &super::tile::Scattered, max: bool) {
        use Operand::Reg as R;
        let first = sc.layout.slots()[0];
        // One plan for the tile's origin; each value's column is the thread's first plus its offset.
        let plan = self.plan_for(g, idx, sc.layout, sc.ty, true, Some(sc.writers));
        let &(_, row_addr, _, row_in) = plan.rows.iter().find(|p| p.0 == first.dr).expect("planned row");
        for &(v, off) in &sc.values {
            let (addr, p) = match (plan.col0, plan.col_dim, plan.col_stride_bytes) {
                (Some(c0), Some(dim), Some(sb)) => {
                    let c = self.reg(RegClass::B32, "scatter_c");
                    self.op("add.s32", vec![R(c), R(c0), R(off)]);
                    self.element_addr(row_addr, row_in, (c, dim, sb), first.dc)
                }
                _ => (row_addr, row_in),
            };
            self.red(addr, p, v, max);
        }
    }

    /// One f32 atomic add (or max: as integers, by sign) of `r` at `addr` where `p`.
    fn red(&mut self, addr: Reg, p: Reg, r: Reg, max: bool) {
        use Operand::{Imm, Reg as R};
        if !max {
            self.op_if(p, false, "red.global.add.f32", vec![Operand::Addr(addr, 0), R(r)]);
            return;
        }
        let bits = self.reg(RegClass::B32, "bits");
        self.op("mov.b32", vec![R(bits), R(r)]);
        let (pos, neg) = (self.reg(RegClass::Pred, "pos"), self.reg(RegClass::Pred, "neg"));
        self.op("setp.ge.and.s32", vec![R(pos), R(bits), Imm(0), R(p)]);
        self.op("setp.lt.and.s32", vec![R(neg), R(bits), Imm(0), R(p)]);
        self.op_if(pos, false, "red.global.max.s32", vec![Operand::Addr(addr, 0), R(bits)]);
        self.op_if(neg, false, "red.global.min.u32", vec![Operand::Addr(addr, 0), R(bits)]);
    }

    /// Stores a tile at origin `idx`; each element is written once, by its owner, if in bounds.
    pub(crate) fn store(&mut self, g: &GlobalVal, idx: &[Operand], t: &TileVal) {
        let plan = self.plan(g, idx, t.layout, t.ty, true);
        self.stream(&plan, t.layout, t.ty, &t.regs, None, "st.global", false);
    }

    fn plan(&mut self, g: &GlobalVal, idx: &[Operand], layout: Layout, ty: TileType, owners_only: bool) -> Plan {
        self.plan_for(g, idx, layout, ty, owners_only, None)
    }

    /// [`Self::plan`], the threads that write given by `writers` where it is given (instead of
    /// the layout's owners).
    fn plan_for(&mut self, g: &GlobalVal, idx: &[Operand], layout: Layout, ty: TileType, owners_only: bool, writers: Option<Reg>) -> Plan {
        use Operand::{Imm, Reg as R};
        let rank = g.rank;
        let es = i64::from(ty.dtype.size());
        let gr = self.global_regs(g);
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
        self.op("mov.b64", vec![R(base), R(gr.ptr)]);
        let inb = self.reg(RegClass::Pred, "inb");
        if let Some(w) = writers {
            self.op("mov.pred", vec![R(inb), R(w)]);
        } else if owners_only {
            self.op("mov.pred", vec![R(inb), R(lr.owner)]);
        } else {
            self.op("setp.eq.u32", vec![R(inb), R(self.lane), R(self.lane)]);
        }
        for (k, i) in idx.iter().enumerate() {
            if Some(k) == row_axis || Some(k) == col_axis {
                continue;
            }
            let ir = self.reg(RegClass::B32, "idx");
            self.op("mov.b32", vec![R(ir), i.clone()]);
            self.op("setp.lt.and.u32", vec![R(inb), R(ir), R(gr.dims[k]), R(inb)]);
            self.term(base, ir, gr.strides[k], es);
        }
        let row_stride_bytes = row_axis.map(|a| {
            let rb = self.reg(RegClass::B32, "rsb");
            self.op("mul.lo.s32", vec![R(rb), R(gr.strides[a]), Imm(es)]);
            rb
        });
        let (col0, col_dim, col_stride_bytes, unit) = match col_axis {
            Some(a) => {
                let c0 = self.reg(RegClass::B32, "c");
                self.op("add.s32", vec![R(c0), R(lr.col), idx[a].clone()]);
                let sb = self.reg(RegClass::B32, "csb");
                self.op("mul.lo.s32", vec![R(sb), R(gr.strides[a]), Imm(es)]);
                let unit = self.reg(RegClass::Pred, "unit_stride");
                self.op("setp.eq.u32", vec![R(unit), R(gr.strides[a]), Imm(1)]);
                (Some(c0), Some(gr.dims[a]), Some(sb), Some(unit))
            }
            None => (None, None, None, None),
        };
        let mut rows = Vec::new();
        let mut seen: Vec<u32> = Vec::new();
        for sl in layout.slots() {
            if seen.contains(&sl.dr) {
                continue;
            }
            seen.push(sl.dr);
            let addr = self.reg(RegClass::B64, "row");
            let p = self.reg(RegClass::Pred, "rowin");
            match row_axis {
                Some(a) => {
                    let r = self.reg(RegClass::B32, "r");
                    self.op("add.s32", vec![R(r), R(lr.row), idx[a].clone()]);
                    if sl.dr > 0 {
                        self.op("add.s32", vec![R(r), R(r), Imm(i64::from(sl.dr))]);
                    }
                    self.op("setp.lt.and.u32", vec![R(p), R(r), R(gr.dims[a]), R(inb)]);
                    self.op("mov.b64", vec![R(addr), R(base)]);
                    self.term(addr, r, gr.strides[a], es);
                }
                None => {
                    self.op("mov.pred", vec![R(p), R(inb)]);
                    self.op("mov.b64", vec![R(addr), R(base)]);
                }
            }
            // Where the thread's first column is, if columns are dense.
            let first = self.reg(RegClass::B64, "rowc");
            match col0 {
                Some(c0) => {
                    let t = self.reg(RegClass::B64, "coff");
                    self.op("mul.wide.s32", vec![R(t), R(c0), Imm(es)]);
                    self.op("add.s64", vec![R(first), R(addr), R(t)]);
                }
                None => self.op("mov.b64", vec![R(first), R(addr)]),
            }
            rows.push((sl.dr, addr, first, p));
        }
        Plan { rows, col0, col_dim, col_stride_bytes, unit, row_stride_bytes }
    }

    /// Moves every register of the tile, by one of three paths chosen per thread at run time:
    /// every element in bounds, dense and aligned: unguarded vectors at immediate offsets from
    /// the thread's first element of each row; runs that each lie wholly inside or wholly past
    /// the row's end (the row's length minus the first column a multiple of the run): the same
    /// vectors, each guarded by its run's column test, no branches; anything else (edge rows,
    /// strided or misaligned views, runs straddling the end): the general path, run by run.
    /// A load given `packs` (see [`Self::load_regs`]) leaves its data in them on every path.
    #[allow(clippy::too_many_arguments)]
    fn stream(&mut self, plan: &Plan, layout: Layout, ty: TileType, regs: &[Reg], packs: Option<&[Reg]>, op: &str, load: bool) {
        use Operand::{Imm, Reg as R, Sym};
        let Some((dense, all_in, chunk)) = self.fast_path(plan, layout, ty) else {
            return self.stream_general(plan, layout, ty, regs, packs, op, load);
        };
        let run = layout.run_len();
        let (c0, dim) = (plan.col0.expect("a fast path has columns"), plan.col_dim.expect("a fast path has columns"));
        let (partial, slow, done) = (self.label("partial"), self.label("slow"), self.label("moved"));
        self.op_if(all_in, true, "bra", vec![Sym(partial.clone())]);
        self.vector_runs(plan, layout, None, ty, regs, packs, op, load, chunk);
        self.op("bra", vec![Sym(done.clone())]);
        self.body.push(crate::tirt::Inst::Label(partial));
        // Runs wholly inside or wholly past the row's end (dense ∧ first column ≥ 0 ∧ dim −
        // first column a multiple of the run): each vector guarded by its run's column test.
        // Not for MMA accumulators (the GEMM epilogues, where registers are scarce).
        if matches!(layout.kind, crate::layout::LayoutKind::Blocked { .. }) {
            let runs = self.reg(RegClass::Pred, "runs");
            self.op("setp.ge.and.s32", vec![R(runs), R(c0), Imm(0), R(dense)]);
            let rest = self.reg(RegClass::B32, "rest");
            self.op("sub.s32", vec![R(rest), R(dim), R(c0)]);
            self.op("and.b32", vec![R(rest), R(rest), Imm(i64::from(run - 1))]);
            self.op("setp.eq.and.u32", vec![R(runs), R(rest), Imm(0), R(runs)]);
            self.op_if(runs, true, "bra", vec![Sym(slow.clone())]);
            self.vector_runs(plan, layout, Some((c0, dim)), ty, regs, packs, op, load, chunk);
            self.op("bra", vec![Sym(done.clone())]);
        }
        self.body.push(crate::tirt::Inst::Label(slow));
        self.stream_general(plan, layout, ty, regs, packs, op, load);
        self.body.push(crate::tirt::Inst::Label(done));
    }

    /// Whether a tile can take the fast path (`stream`'s first), and if so the predicates
    /// `dense` (unit stride, rows in bounds, aligned) and `all in` (dense and every column in
    /// bounds), and the vector size in bytes.
    fn fast_path(&mut self, plan: &Plan, layout: Layout, ty: TileType) -> Option<(Reg, Reg, u32)> {
        let (Some(c0), Some(dim), Some(unit)) = (plan.col0, plan.col_dim, plan.unit) else { return None };
        let run = layout.run_len();
        if run < 2 || run * ty.dtype.size() < 4 {
            return None;
        }
        use Operand::{Imm, Reg as R};
        let chunk = (run * ty.dtype.size()).min(16);
        let slots = layout.slots();
        // dense = unit stride ∧ every row in bounds ∧ first element and row stride aligned.
        let dense = self.reg(RegClass::Pred, "dense");
        self.op("mov.pred", vec![R(dense), R(unit)]);
        for &(_, _, _, row_in) in &plan.rows {
            self.op("and.pred", vec![R(dense), R(dense), R(row_in)]);
        }
        let low = self.reg(RegClass::B32, "align");
        self.op("cvt.u32.u64", vec![R(low), R(plan.rows[0].2)]);
        if let Some(rb) = plan.row_stride_bytes {
            self.op("or.b32", vec![R(low), R(low), R(rb)]);
        }
        self.op("and.b32", vec![R(low), R(low), Imm(i64::from(chunk - 1))]);
        self.op("setp.eq.and.u32", vec![R(dense), R(low), Imm(0), R(dense)]);
        // all in = dense ∧ first and last columns in bounds: unguarded vectors.
        let all_in = self.reg(RegClass::Pred, "allin");
        let max_dc = slots.iter().map(|s| s.dc).max().unwrap_or(0);
        let last = self.reg(RegClass::B32, "clast");
        self.op("add.s32", vec![R(last), R(c0), Imm(i64::from(max_dc))]);
        self.op("setp.lt.and.u32", vec![R(all_in), R(last), R(dim), R(dense)]);
        self.op("setp.lt.and.u32", vec![R(all_in), R(c0), R(dim), R(all_in)]);
        Some((dense, all_in, chunk))
    }

    /// Moves every run as vectors at immediate offsets from the thread's first element of its
    /// row; with `guard = (first column, dim)`, each run only where its first column is inside.
    #[allow(clippy::too_many_arguments)]
    fn vector_runs(
        &mut self, plan: &Plan, layout: Layout, guard: Option<(Reg, Reg)>, ty: TileType, regs: &[Reg], packs: Option<&[Reg]>, op: &str,
        load: bool, chunk: u32,
    ) {
        use Operand::{Imm, Reg as R};
        let es = ty.dtype.size();
        let (slots, run) = (layout.slots(), layout.run_len() as usize);
        let mut i = 0;
        while i < slots.len() {
            let sl = slots[i];
            let first = plan.rows.iter().find(|r| r.0 == sl.dr).expect("planned row").2;
            let inside = guard.map(|(c0, dim)| {
                let (c, inside) = (self.reg(RegClass::B32, "crun"), self.reg(RegClass::Pred, "runin"));
                self.op("add.s32", vec![R(c), R(c0), Imm(i64::from(sl.dc))]);
                self.op("setp.lt.u32", vec![R(inside), R(c), R(dim)]);
                inside
            });
            let words = packs.map(|p| &p[i / 2..(i + run) / 2]);
            self.vector_move(inside, first, i64::from(sl.dc * es), &regs[i..i + run], words, ty, op, load, chunk);
            i += run;
        }
    }

    /// The general path: each run as a vector if it can, else element by element. A load
    /// given `packs` unpacks each run's filled pairs just before the run and packs them again
    /// after it, so that only one run's halves are live at a time.
    #[allow(clippy::too_many_arguments)]
    fn stream_general(&mut self, plan: &Plan, layout: Layout, ty: TileType, regs: &[Reg], packs: Option<&[Reg]>, op: &str, load: bool) {
        use Operand::{Imm, Reg as R};
        let es = ty.dtype.size();
        let slots = layout.slots();
        let run = layout.run_len() as usize;
        let run_bytes = run as u32 * es;
        let vectorize = plan.col0.is_some() && run > 1 && run_bytes >= 4;
        let mut i = 0;
        while i < slots.len() {
            let sl = slots[i];
            let &(_, row_addr, row_first, row_in) = plan.rows.iter().find(|r| r.0 == sl.dr).expect("planned row");
            let n = if vectorize { run } else { 1 };
            // A paired load's run is of 2+ 16-bit columns, so it vectorizes (`n == run`); a tile
            // without columns (a run of 1) has no `packs`.
            debug_assert!(packs.is_none() || n == run, "paired loads move whole runs");
            let words = packs.map(|p| &p[i / 2..(i + run) / 2]);
            if let Some(w) = words {
                self.unpack(&regs[i..i + run], Some(w));
            }
            // Elements i..i+n: columns dc..dc+n-1 of one row.
            let (Some(c0), Some(dim), Some(sb), Some(unit)) = (plan.col0, plan.col_dim, plan.col_stride_bytes, plan.unit) else {
                // No column axis: one element per row.
                let p = row_in;
                self.access(op, load, p, Operand::Addr(row_addr, 0), regs[i], es);
                i += 1;
                continue;
            };
            let mut vector = None;
            if vectorize {
                let chunk = run_bytes.min(16);
                let last = self.reg(RegClass::B32, "clast");
                self.op("add.s32", vec![R(last), R(c0), Imm(i64::from(sl.dc) + n as i64 - 1)]);
                let first = self.reg(RegClass::B32, "cfirst");
                self.op("add.s32", vec![R(first), R(c0), Imm(i64::from(sl.dc))]);
                let low = self.reg(RegClass::B32, "align");
                self.op("cvt.u32.u64", vec![R(low), R(row_first)]);
                self.op("add.u32", vec![R(low), R(low), Imm(i64::from(sl.dc * es))]);
                self.op("and.b32", vec![R(low), R(low), Imm(i64::from(chunk - 1))]);
                let v = self.reg(RegClass::Pred, "vec");
                self.op("setp.eq.and.u32", vec![R(v), R(low), Imm(0), R(unit)]);
                self.op("setp.lt.and.u32", vec![R(v), R(last), R(dim), R(v)]);
                self.op("setp.lt.and.u32", vec![R(v), R(first), R(dim), R(v)]);
                self.op("and.pred", vec![R(v), R(v), R(row_in)]);
                self.vector_move(Some(v), row_first, i64::from(sl.dc * es), &regs[i..i + n], None, ty, op, load, chunk);
                // A run moved as a vector, or wholly outside the row (past its end or before
                // its start, compared signed) or outside the rows, needs nothing element by
                // element: only runs that straddle the row's start or end do. (Unsigned, a run
                // from column −2 to 1 would read as wholly past the end, and leave columns 0
                // and 1 unloaded.)
                let (skip, outside) = (self.reg(RegClass::Pred, "skip"), self.reg(RegClass::Pred, "outside"));
                self.op("setp.ge.or.s32", vec![R(skip), R(first), R(dim), R(v)]);
                self.op("setp.lt.or.s32", vec![R(skip), R(last), Imm(0), R(skip)]);
                self.op("not.pred", vec![R(outside), R(row_in)]);
                self.op("or.pred", vec![R(skip), R(skip), R(outside)]);
                let label = self.label("run_done");
                self.op_if(skip, false, "bra", vec![Operand::Sym(label.clone())]);
                vector = Some(label);
            }
            for k in 0..n {
                let (addr, p) = self.element_addr(row_addr, row_in, (c0, dim, sb), slots[i + k].dc);
                self.access(op, load, p, Operand::Addr(addr, 0), regs[i + k], es);
            }
            if let Some(label) = vector {
                self.body.push(crate::tirt::Inst::Label(label));
            }
            // Packs exist only for paired loads, which move whole runs (`n == run`).
            if let Some(w) = words {
                self.pack(&regs[i..i + run], Some(w));
            }
            i += n;
        }
    }

    /// The address of the element `dc` columns past the thread's first in a row at `row_addr`
    /// (columns from `c0`, `dim` of them, `sb` bytes apart), and whether it is in bounds.
    fn element_addr(&mut self, row_addr: Reg, row_in: Reg, (c0, dim, sb): (Reg, Reg, Reg), dc: u32) -> (Reg, Reg) {
        use Operand::{Imm, Reg as R};
        let c = self.reg(RegClass::B32, "ck");
        self.op("add.s32", vec![R(c), R(c0), Imm(i64::from(dc))]);
        let p = self.reg(RegClass::Pred, "in");
        self.op("setp.lt.and.u32", vec![R(p), R(c), R(dim), R(row_in)]);
        let off = self.reg(RegClass::B64, "off");
        self.op("mul.wide.s32", vec![R(off), R(c), R(sb)]);
        let addr = self.reg(RegClass::B64, "addr");
        self.op("add.s64", vec![R(addr), R(row_addr), R(off)]);
        (addr, p)
    }

    fn access(&mut self, op: &str, load: bool, p: Reg, addr: Operand, r: Reg, es: u32) {
        let inst = format!("{op}.{}", super::bits(es));
        let args = if load { vec![Operand::Reg(r), addr] } else { vec![addr, Operand::Reg(r)] };
        self.op_if(p, false, &inst, args);
    }

    /// Moves one run of registers with vector loads or stores at `[base + off]`, guarded by
    /// `pred`. 16-bit elements travel in pairs packed into b32 lanes; a load given the run's
    /// `packed` words (one per pair) leaves them packed.
    #[allow(clippy::too_many_arguments)]
    fn vector_move(
        &mut self, pred: Option<Reg>, base: Reg, off: i64, regs: &[Reg], packed: Option<&[Reg]>, ty: TileType, op: &str, load: bool,
        chunk_bytes: u32,
    ) {
        use Operand::{Reg as R, Vec as V};
        let emit = |lw: &mut Self, inst: &str, args: Vec<Operand>| match pred {
            Some(p) => lw.op_if(p, false, inst, args),
            None => lw.op(inst, args),
        };
        let per_chunk = (chunk_bytes / ty.dtype.size()) as usize;
        for (c, chunk) in regs.chunks(per_chunk).enumerate() {
            let addr = Operand::Addr(base, off + i64::from(chunk_bytes) * c as i64);
            let lanes = (chunk_bytes / 4) as usize;
            let vop = if lanes == 1 { format!("{op}.b32") } else { format!("{op}.v{lanes}.b32") };
            if ty.dtype.size() == 4 {
                let regs = if lanes == 1 { R(chunk[0]) } else { V(chunk.to_vec()) };
                let args = if load { vec![regs, addr] } else { vec![addr, regs] };
                emit(self, &vop, args);
                continue;
            }
            let wop = |w: &[Reg]| if lanes == 1 { R(w[0]) } else { V(w.to_vec()) };
            if let (true, Some(packed)) = (load, packed) {
                emit(self, &vop, vec![wop(&packed[c * lanes..(c + 1) * lanes]), addr]);
                continue;
            }
            let words: Vec<Reg> = (0..lanes).map(|_| self.reg(RegClass::B32, "pack")).collect();
            if load {
                // Guarded: the words start as the (fill-initialized) pairs and the unpacking is
                // unconditional, so ptxas can rename it away; a guarded unpack must wait for its
                // load, which held back the loads after it (run 70: 11008-wide rows in a
                // 11264-wide tile at 0.78× copy, against 0.96 at 12288, unguarded).
                if pred.is_some() {
                    self.pack_words(chunk, &words, ty.dtype.size());
                }
                emit(self, &vop, vec![wop(&words), addr]);
                self.unpack_words(chunk, &words, ty.dtype.size());
            } else {
                self.pack_words(chunk, &words, ty.dtype.size());
                emit(self, &vop, vec![addr, wop(&words)]);
            }
        }
    }

    /// The address of element `idx` of `g`, and whether it is in bounds.
    fn element(&mut self, g: &GlobalVal, idx: &[Operand]) -> (Reg, Reg) {
        use Operand::Reg as R;
        let gr = self.global_regs(g);
        let addr = self.reg(RegClass::B64, "at");
        self.op("mov.b64", vec![R(addr), R(gr.ptr)]);
        let inb = self.reg(RegClass::Pred, "inb");
        self.op("setp.eq.u32", vec![R(inb), R(self.lane), R(self.lane)]);
        let es = i64::from(g.dtype.size());
        for (k, i) in idx.iter().enumerate() {
            let ir = self.reg(RegClass::B32, "idx");
            self.op("mov.b32", vec![R(ir), i.clone()]);
            self.op("setp.lt.and.u32", vec![R(inb), R(ir), R(gr.dims[k]), R(inb)]);
            self.term(addr, ir, gr.strides[k], es);
        }
        (addr, inb)
    }

    /// `let old = tensor.fetch_add(idx, v)`: the warpgroup's writes ordered before the
    /// leader's (a barrier; its TMA stores completed and fenced against the generic proxy),
    /// the leader's `atom.acq_rel.gpu.add`, and its old value handed to every thread through
    /// the warpgroup's scratch (a barrier after the leader's write; the next writer of the
    /// scratch passes a barrier first). Out of bounds: no addition, the value 0.
    /// `inc`: `fetch_inc`, `atom.inc` (0 past the limit `v`).
    pub(crate) fn fetch_add(&mut self, g: &GlobalVal, idx: &[Operand], v: Operand, inc: bool) -> Reg {
        use Operand::{Addr, Imm, Reg as R};
        let (addr, add, vr) = self.leader_add(g, idx, v);
        let old = self.reg(RegClass::B32, "old");
        self.op("mov.b32", vec![R(old), Imm(0)]);
        let op = if inc { "atom.acq_rel.gpu.global.inc.u32" } else { "atom.acq_rel.gpu.global.add.u32" };
        self.op_if(add, false, op, vec![R(old), Addr(addr, 0), R(vr)]);
        self.leader_to_all(old, "ticket")
    }

    /// The leader's `v` in every thread of the warpgroup, through its scratch: the leader's
    /// store, a barrier, each thread's load (the next writer of the scratch passes a barrier
    /// first).
    fn leader_to_all(&mut self, v: Reg, name: &str) -> Reg {
        use Operand::{Addr, Reg as R};
        self.need_scratch(4);
        let (scratch, leader) = (self.scratch, self.leader);
        self.op_if(leader, false, "st.shared.u32", vec![Addr(scratch, 0), R(v)]);
        self.warpgroup_barrier();
        let out = self.reg(RegClass::B32, name);
        self.op("ld.shared.u32", vec![R(out), Addr(scratch, 0)]);
        out
    }

    /// What an addition by the warpgroup's leader needs, the warpgroup's writes ordered before
    /// it (a barrier; its TMA stores completed and fenced against the generic proxy): the
    /// element's address, whether the leader adds (in bounds), and `v` in a register.
    fn leader_add(&mut self, g: &GlobalVal, idx: &[Operand], v: Operand) -> (Reg, Reg, Reg) {
        use Operand::{Imm, Reg as R};
        let (addr, inb) = self.element(g, idx);
        let leader = self.leader;
        self.warpgroup_barrier();
        if self.sm90() {
            self.op_if(leader, false, "cp.async.bulk.wait_group", vec![Imm(0)]);
            self.op_if(leader, false, "fence.proxy.async.global", vec![]);
        }
        let add = self.reg(RegClass::Pred, "adds");
        self.op("and.pred", vec![R(add), R(inb), R(leader)]);
        let vr = self.reg(RegClass::B32, "add");
        self.op("mov.b32", vec![R(vr), v]);
        (addr, add, vr)
    }

    /// `tensor.fetch_add(idx, v);` with its old value unused: the warpgroup's writes ordered
    /// before the leader's (a barrier; its TMA stores completed and fenced against the generic
    /// proxy), then the leader's `red.release.gpu.add`, which nothing waits for — a flag raised
    /// for other blocks. Out of bounds: no addition.
    pub(crate) fn add_release(&mut self, g: &GlobalVal, idx: &[Operand], v: Operand, inc: bool) {
        use Operand::{Addr, Reg as R};
        let (addr, add, vr) = self.leader_add(g, idx, v);
        let op = if inc { "red.release.gpu.global.inc.u32" } else { "red.release.gpu.global.add.u32" };
        self.op_if(add, false, op, vec![Addr(addr, 0), R(vr)]);
    }

    /// `let flag = tensor.wait_nonzero(idx)`: the leader reads the element (`ld.acquire.gpu`)
    /// until it is not 0, sleeping ~100 ns between reads (spinning readers slow the memory
    /// system for everyone), and hands it to every thread (`leader_to_all`; a barrier before the
    /// wait, for the readers of the scratch's last value). Out of bounds: 0 at once.
    pub(crate) fn wait_nonzero(&mut self, g: &GlobalVal, idx: &[Operand]) -> Reg {
        use Operand::{Addr, Imm, Reg as R, Sym};
        let (addr, inb) = self.element(g, idx);
        let leader = self.leader;
        let (spin, done) = (self.label("spin"), self.label("waited"));
        self.warpgroup_barrier();
        let v = self.reg(RegClass::B32, "flag");
        self.op("mov.b32", vec![R(v), Imm(0)]);
        // Threads other than the leader, and a leader out of bounds, go straight to the hand-out.
        self.op_if(leader, true, "bra", vec![Sym(done.clone())]);
        self.op_if(inb, true, "bra", vec![Sym(done.clone())]);
        self.body.push(crate::tirt::Inst::Label(spin.clone()));
        self.op("ld.acquire.gpu.global.u32", vec![R(v), Addr(addr, 0)]);
        let raised = self.reg(RegClass::Pred, "raised");
        self.op("setp.ne.u32", vec![R(raised), R(v), Imm(0)]);
        self.op_if(raised, false, "bra", vec![Sym(done.clone())]);
        self.op("nanosleep.u32", vec![Imm(100)]);
        self.op("bra", vec![Sym(spin)]);
        self.body.push(crate::tirt::Inst::Label(done));
        self.leader_to_all(v, "flag")
    }

    /// `tensor.get(idx)`: one 4-byte element, 0 where `idx` is out of bounds.
    pub(crate) fn get(&mut self, g: &GlobalVal, idx: &[Operand], ty: crate::dtype::ScalarType) -> Reg {
        use Operand::{Addr, Imm, Reg as R};
        let (addr, inb) = self.element(g, idx);
        let es = i64::from(g.dtype.size());
        let nc = if g.written { "" } else { ".nc" };
        if es < 4 {
            // A 16-bit or 8-bit float, widened: zero bits are 0.0 in every format.
            let h = self.reg(RegClass::B16, &g.name);
            self.op("mov.b16", vec![R(h), Imm(0)]);
            self.op_if(inb, false, &format!("ld.global{nc}.{}", super::bits(g.dtype.size())), vec![R(h), Addr(addr, 0)]);
            return self.widen_f32(h, g.dtype);
        }
        let r = self.reg(super::scalar_class(ty), &g.name);
        self.op("mov.b32", vec![R(r), Imm(0)]);
        self.op_if(inb, false, &format!("ld.global{nc}.b32"), vec![R(r), Addr(addr, 0)]);
        r
    }

    /// `acc += (s64)index * stride * es`
    pub(crate) fn term(&mut self, acc: Reg, index: Reg, stride: Reg, es: i64) {
        use Operand::{Imm, Reg as R};
        let sb = self.reg(RegClass::B32, "sbytes");
        self.op("mul.lo.s32", vec![R(sb), R(stride), Imm(es)]);
        let t = self.reg(RegClass::B64, "term");
        self.op("mul.wide.s32", vec![R(t), R(index), R(sb)]);
        self.op("add.s64", vec![R(acc), R(acc), R(t)]);
    }
}
