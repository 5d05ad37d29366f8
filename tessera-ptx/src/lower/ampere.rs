//! The sm_80 lowering of the pipeline pieces, so that a kernel written for Hopper also runs on
//! Ampere and later (and, through `Device::with_target`, is tested on Hopper):
//!
//! - `tma::load` → the producer warpgroup's 128 threads copy the box 16 bytes at a time with
//!   `cp.async.cg` (zero-filled out of bounds), into the same swizzled layout TMA writes;
//! - `pipe.commit` → every producer thread's `cp.async.mbarrier.arrive.noinc` (the full
//!   barrier counts 128 arrivals), waits → `mbarrier.test_wait.parity`;
//! - `mma_sync` → `ldmatrix` + `mma.sync.m16n8k16`: warp `w` of a consumer warpgroup computes
//!   rows `16w..16w+16` of each 64-row block. Its C fragment is, register for register, the
//!   wgmma m64nN accumulator's, so tiles and epilogues are shared;
//! - `mma_wait`, `setmaxnreg` → nothing.

use super::hopper::{k_major_bytes, MmaA, ViewVal};
use super::Lowerer;
use crate::tirt::{Operand, Reg, RegClass};

/// The swizzle of byte `off` within a 1024-aligned tile: the 16-byte chunk XOR the row bits.
fn swizzle_mask(swizzle: u32) -> i64 {
    match swizzle {
        128 => 7,
        64 => 3,
        32 => 1,
        _ => 0,
    }
}

impl Lowerer<'_> {
    /// `dst = off ^ (((off >> 7) & mask) << 4)`: the swizzled byte offset.
    pub(crate) fn swizzled_offset(&mut self, off: Reg, swizzle: u32) -> Reg {
        self.swizzled(off, swizzle)
    }

    fn swizzled(&mut self, off: Reg, swizzle: u32) -> Reg {
        use Operand::{Imm, Reg as R};
        let mask = swizzle_mask(swizzle);
        if mask == 0 {
            return off;
        }
        let x = self.reg(RegClass::B32, "swz");
        self.op("shr.u32", vec![R(x), R(off), Imm(7)]);
        self.op("and.b32", vec![R(x), R(x), Imm(mask)]);
        self.op("shl.b32", vec![R(x), R(x), Imm(4)]);
        let d = self.reg(RegClass::B32, "swz");
        self.op("xor.b32", vec![R(d), R(off), R(x)]);
        d
    }

    /// Thread index within the warpgroup.
    fn wg_thread(&mut self) -> Reg {
        use Operand::{Imm, Reg as R};
        let t = self.reg(RegClass::B32, "wgt");
        let (warp, lane) = (self.warp, self.lane);
        self.op("shl.b32", vec![R(t), R(warp), Imm(5)]);
        self.op("add.u32", vec![R(t), R(t), R(lane)]);
        t
    }

    /// A box copy into a ring stage by the 128 threads of the producer warpgroup.
    pub(crate) fn tma_load_sm80(&mut self, v: &ViewVal, tensor: &str, idx: &[Operand]) {
        use Operand::{Imm, Reg as R};
        let g = self.global(tensor);
        let gr = self.global_regs(&g);
        let rank = g.rank;
        let es = v.ty.dtype.size();
        let panel_bytes = if v.ty.swizzle > 0 { v.ty.swizzle } else { v.ty.row_bytes() };
        let cpr = panel_bytes / 16; // 16-byte chunks per row of a panel
        let t = self.wg_thread();
        let (ct, rt) = (self.reg(RegClass::B32, "cpc"), self.reg(RegClass::B32, "cpr"));
        self.op("rem.u32", vec![R(ct), R(t), Imm(i64::from(cpr))]);
        self.op("div.u32", vec![R(rt), R(t), Imm(i64::from(cpr))]);
        // The uniform part: the tensor's base plus the leading indices, and their bounds.
        let base = self.reg(RegClass::B64, "cpbase");
        self.op("mov.b64", vec![R(base), R(gr.ptr)]);
        let inb = self.reg(RegClass::Pred, "cpin");
        let lane = self.lane;
        self.op("setp.eq.u32", vec![R(inb), R(lane), R(lane)]);
        for (k, i) in idx.iter().enumerate().take(rank - 2) {
            let ir = self.reg(RegClass::B32, "idx");
            self.op("mov.b32", vec![R(ir), i.clone()]);
            self.op("setp.lt.and.u32", vec![R(inb), R(ir), R(gr.dims[k]), R(inb)]);
            let sb = self.reg(RegClass::B32, "sb");
            self.op("mul.lo.s32", vec![R(sb), R(gr.strides[k]), Imm(i64::from(es))]);
            let term = self.reg(RegClass::B64, "term");
            self.op("mul.wide.s32", vec![R(term), R(ir), R(sb)]);
            self.op("add.s64", vec![R(base), R(base), R(term)]);
        }
        let (row_idx, col_idx) = (idx[rank - 2].clone(), idx[rank - 1].clone());
        let (row_dim, col_dim) = (gr.dims[rank - 2], gr.dims[rank - 1]);
        let rsb = self.reg(RegClass::B32, "rsb");
        self.op("mul.lo.s32", vec![R(rsb), R(gr.strides[rank - 2]), Imm(i64::from(es))]);
        let rows_per_pass = 128 / cpr;
        let passes = (v.rows * cpr).div_ceil(128);
        // Source and destination advance by a pass (rows_per_pass rows) at a time: a running
        // pointer, not one address per pass, so that nothing per pass is hoisted out of loops.
        let step = self.reg(RegClass::B64, "cpstep");
        self.op("mul.wide.s32", vec![R(step), R(rsb), Imm(i64::from(rows_per_pass))]);
        for p in 0..v.ty.panels() {
            // This thread's column: its chunk of panel p.
            let col = self.reg(RegClass::B32, "gcol");
            self.op("mul.lo.u32", vec![R(col), R(ct), Imm(i64::from(16 / es))]);
            self.op("add.s32", vec![R(col), R(col), col_idx.clone()]);
            if p > 0 {
                self.op("add.s32", vec![R(col), R(col), Imm(i64::from(p * v.ty.panel_cols()))]);
            }
            let col_in = self.reg(RegClass::Pred, "colin");
            self.op("setp.lt.and.u32", vec![R(col_in), R(col), R(col_dim), R(inb)]);
            // First row of this thread: rt; its source address and the destination offset.
            let grow = self.reg(RegClass::B32, "grow");
            self.op("add.s32", vec![R(grow), R(rt), row_idx.clone()]);
            let src = self.reg(RegClass::B64, "src");
            self.op("mul.wide.s32", vec![R(src), R(grow), R(rsb)]);
            self.op("add.s64", vec![R(src), R(src), R(base)]);
            let coff = self.reg(RegClass::B64, "coff");
            self.op("mul.wide.s32", vec![R(coff), R(col), Imm(i64::from(es))]);
            self.op("add.s64", vec![R(src), R(src), R(coff)]);
            let off = self.reg(RegClass::B32, "cpoff");
            self.op("mul.lo.u32", vec![R(off), R(rt), Imm(i64::from(panel_bytes))]);
            let cb = self.reg(RegClass::B32, "cpcb");
            self.op("shl.b32", vec![R(cb), R(ct), Imm(4)]);
            self.op("add.u32", vec![R(off), R(off), R(cb)]);
            for i in 0..passes {
                if i > 0 {
                    self.op("add.s64", vec![R(src), R(src), R(step)]);
                    self.op("add.s32", vec![R(grow), R(grow), Imm(i64::from(rows_per_pass))]);
                    self.op("add.u32", vec![R(off), R(off), Imm(i64::from(rows_per_pass * panel_bytes))]);
                }
                let ok = self.reg(RegClass::Pred, "cpok");
                self.op("setp.lt.and.u32", vec![R(ok), R(grow), R(row_dim), R(col_in)]);
                let mine = self.reg(RegClass::Pred, "cpmine");
                if (i + 1) * rows_per_pass > v.rows {
                    // A partial last pass: threads past the box's rows copy nothing.
                    let r = self.reg(RegClass::B32, "crow");
                    self.op("add.u32", vec![R(r), R(rt), Imm(i64::from(i * rows_per_pass))]);
                    self.op("setp.lt.u32", vec![R(mine), R(r), Imm(i64::from(v.rows))]);
                } else {
                    self.op("setp.eq.u32", vec![R(mine), R(lane), R(lane)]);
                }
                // Out of bounds: read nothing from the tensor's base, write zeros.
                let from = self.reg(RegClass::B64, "from");
                self.op("selp.b64", vec![R(from), R(src), R(base), R(ok)]);
                let size = self.reg(RegClass::B32, "cpsize");
                self.op("selp.b32", vec![R(size), Imm(16), Imm(0), R(ok)]);
                let sw = self.swizzled(off, v.ty.swizzle);
                let dst = self.reg(RegClass::B32, "cpdst");
                self.op("add.u32", vec![R(dst), R(v.addr), R(sw)]);
                let panel_off = i64::from(p * v.ty.rows * panel_bytes);
                self.op_if(
                    mine,
                    false,
                    "cp.async.cg.shared.global",
                    vec![Operand::Addr(dst, panel_off), Operand::Addr(from, 0), Imm(16), R(size)],
                );
            }
        }
    }

    /// `acc += a·bᵀ` (or `a·b` with `b_kn`) with `ldmatrix` and `mma.sync.m16n8k16`.
    ///
    /// Registers are what limits this path (the 128-register accumulator shares 168 with the
    /// rest at 384 threads), so each lane keeps two offsets and fragments are loaded just before
    /// use: A as one `ldmatrix.x4` per k16 step, B as one `ldmatrix.x2` per 8 columns.
    #[allow(clippy::too_many_arguments)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mma_sm80(&mut self, acc: &[Reg], m_blocks: u32, n: u32, k: u32, a: &MmaA, vb: &ViewVal, b_kn: bool, ab: &str) {
        use Operand::{Imm, Reg as R, Vec as V};
        let (lane, warp) = (self.lane, self.warp);
        let k_steps = k / 16;
        let per_block = (n / 2) as usize;
        // A: lane l reads row 16w + l%16 of the slab at 16-byte chunk 2kk + l/16; as a byte
        // offset before swizzling: a_lane = row·pitch + 16·(l/16).
        let a_lane = self.reg(RegClass::B32, "alane");
        if let MmaA::Smem(va) = a {
            self.op("and.b32", vec![R(a_lane), R(lane), Imm(15)]);
            let t = self.reg(RegClass::B32, "t");
            self.op("shl.b32", vec![R(t), R(warp), Imm(4)]);
            self.op("add.u32", vec![R(a_lane), R(a_lane), R(t)]);
            self.op("mul.lo.u32", vec![R(a_lane), R(a_lane), Imm(i64::from(va.ty.pitch()))]);
            self.op("shr.u32", vec![R(t), R(lane), Imm(4)]);
            self.op("shl.b32", vec![R(t), R(t), Imm(4)]);
            self.op("add.u32", vec![R(a_lane), R(a_lane), R(t)]);
        }
        // B (x2: lanes 0-15 give addresses): lane l reads 8-row matrix l/8, row l%8.
        // N×K: row n = 8j + l%8 at chunk 2kk + (l/8)%2 → b_lane = (l%8)·row_bytes + 16·((l/8)%2).
        // K×N: row k = 16kk + 8·((l/8)%2) + l%8 at chunk j → b_lane = (8·((l/8)%2) + l%8)·span.
        let b_lane = self.reg(RegClass::B32, "blane");
        let hi = self.reg(RegClass::B32, "bhi");
        self.op("shr.u32", vec![R(hi), R(lane), Imm(3)]);
        self.op("and.b32", vec![R(hi), R(hi), Imm(1)]);
        self.op("and.b32", vec![R(b_lane), R(lane), Imm(7)]);
        if b_kn {
            self.op("shl.b32", vec![R(hi), R(hi), Imm(3)]);
            self.op("add.u32", vec![R(b_lane), R(b_lane), R(hi)]);
            self.op("shl.b32", vec![R(b_lane), R(b_lane), Imm(i64::from(vb.ty.pitch().trailing_zeros()))]);
        } else {
            self.op("mul.lo.u32", vec![R(b_lane), R(b_lane), Imm(i64::from(vb.ty.pitch()))]);
            self.op("shl.b32", vec![R(hi), R(hi), Imm(4)]);
            self.op("add.u32", vec![R(b_lane), R(b_lane), R(hi)]);
        }
        for mb in 0..m_blocks {
            for kk in 0..k_steps {
                let a: Vec<Reg> = match a {
                    MmaA::Smem(va) => {
                        // A fragment: offset = a_lane + 64·mb rows + step kk's bytes, swizzled.
                        let off = self.reg(RegClass::B32, "aoff");
                        let at = mb * 64 * va.ty.pitch() + k_major_bytes(&va.ty, kk, va.ty.rows);
                        self.op("add.u32", vec![R(off), R(a_lane), Imm(i64::from(at))]);
                        let off = self.swizzled(off, va.ty.swizzle);
                        let addr = self.reg(RegClass::B32, "aaddr");
                        self.op("add.u32", vec![R(addr), R(va.addr), R(off)]);
                        let a: Vec<Reg> = (0..4).map(|_| self.reg(RegClass::B32, "afrag")).collect();
                        self.op("ldmatrix.sync.aligned.m8n8.x4.shared.b16", vec![V(a.clone()), Operand::Addr(addr, 0)]);
                        a
                    }
                    // mma.sync's A fragment is wgmma's, warp by warp.
                    MmaA::Regs(frags) => frags[(mb * k_steps + kk) as usize].to_vec(),
                };
                for j in 0..n / 8 {
                    let off = self.reg(RegClass::B32, "boff");
                    let base = if b_kn {
                        // k rows 16kk.., 16-byte chunk j of panel j/(span/16).
                        let (span, per) = (vb.ty.pitch(), vb.ty.pitch() / 16);
                        self.op("add.u32", vec![R(off), R(b_lane), Imm(i64::from(16 * kk * span + 16 * (j % per)))]);
                        (j / per) * vb.ty.rows * span
                    } else {
                        let at = 8 * j * vb.ty.pitch() + k_major_bytes(&vb.ty, kk, vb.ty.rows);
                        self.op("add.u32", vec![R(off), R(b_lane), Imm(i64::from(at))]);
                        0
                    };
                    let off = self.swizzled(off, vb.ty.swizzle);
                    let addr = self.reg(RegClass::B32, "baddr");
                    self.op("add.u32", vec![R(addr), R(vb.addr), R(off)]);
                    let b: Vec<Reg> = (0..2).map(|_| self.reg(RegClass::B32, "bfrag")).collect();
                    let ld =
                        if b_kn { "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16" } else { "ldmatrix.sync.aligned.m8n8.x2.shared.b16" };
                    self.op(ld, vec![V(b.clone()), Operand::Addr(addr, i64::from(base))]);
                    let at = mb as usize * per_block + 4 * j as usize;
                    let d = acc[at..at + 4].to_vec();
                    self.op(&format!("mma.sync.aligned.m16n8k16.row.col.f32.{ab}.f32"), vec![V(d.clone()), V(a.clone()), V(b), V(d)]);
                }
            }
        }
    }
}
