//! Register layouts of tiles: which thread of a warpgroup holds which element.
//!
//! Every layout maps a thread to a *base* row and column and lists the thread's registers as
//! *slots*, offsets from that base. Two kinds exist:
//!
//! - [`LayoutKind::Blocked`], for tiles that come from global memory: each thread holds runs of
//!   `v` consecutive columns; `tc` lanes of a warp cover columns and `tr = 32 / tc` cover rows;
//!   `wc`×`wr` warps do the same one level up. The footprint repeats to cover the tile; where the
//!   tile is smaller than the footprint, threads hold replicas, and only the *owner* of an
//!   element stores it or counts it in a sum.
//! - [`LayoutKind::Wgmma`], the f32 accumulator fragment of `wgmma.mma_async` m64nN: thread
//!   `(w, g = lane/4, t = lane%4)` holds rows `16w + g` and `+8` and columns `2t, 2t+1` of every
//!   8-column group, in the instruction's register order; `m_blocks` 64-row blocks stack.
//!
//! A reduction keeps the parent's layout and collapses an axis (`keep_rows`/`keep_cols`): the
//! slots are the parent's projected onto the kept axes, so broadcasting the result back over its
//! parent costs nothing.
//!
//! Tile rows are powers of two; columns are a power of two or a multiple of 8. The blocked
//! layout puts as many lanes along the columns as a power of two dividing the 8-column runs
//! (up to 32: all of 2304's 288, 2 of 176's 22) and splits the warps along columns only as far
//! as that split divides the columns, so every split below is exact. A wgmma accumulator is any
//! multiple of 8 wide (m64nNk16 takes N = 8…256).

/// How a layout spreads a tile over a warpgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayoutKind {
    /// Runs of `v` columns per thread; lanes and warps tile the rest.
    Blocked {
        /// Consecutive columns per thread.
        v: u32,
        /// Lanes along columns.
        tc: u32,
        /// Lanes along rows.
        tr: u32,
        /// Warps along columns.
        wc: u32,
        /// Warps along rows.
        wr: u32,
    },
    /// The wgmma m64nN f32 accumulator, `m_blocks` blocks of 64 rows.
    Wgmma {
        /// 64-row blocks.
        m_blocks: u32,
    },
}

/// A register layout: the parent tile's layout and which axes are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Rows of the tile with this layout (1 if the rows were reduced).
    pub rows: u32,
    /// Columns of the tile with this layout (1 if the columns were reduced).
    pub cols: u32,
    /// Rows of the parent tile.
    pub parent_rows: u32,
    /// Columns of the parent tile.
    pub parent_cols: u32,
    /// How the parent is spread.
    pub kind: LayoutKind,
    /// Whether the row axis is kept (false after a reduction down the rows).
    pub keep_rows: bool,
    /// Whether the column axis is kept (false after a reduction along each row).
    pub keep_cols: bool,
}

/// One register of a thread: its offset from the thread's base row and column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Row offset.
    pub dr: u32,
    /// Column offset.
    pub dc: u32,
}

impl Layout {
    /// The canonical blocked layout of a `rows×cols` tile: runs of 8 columns a thread; where a
    /// warp's lanes all lie along a row but the warps cannot split it (a width not a multiple
    /// of 1024 in a row, so that warps would hold replicas), narrower runs (4, then 2) if those
    /// let every warp hold columns of its own (a row of 2304 = 9 × 256: in runs of 2, 18 columns
    /// a thread, where in runs of 8 one warp held it, 72 a thread).
    pub fn blocked(rows: u32, cols: u32) -> Layout {
        let wide = Layout::blocked_in_runs(rows, cols, cols.min(8));
        if !wide.rows_replicated() || wide.lane_split(0).1 > 1 {
            return wide;
        }
        [4, 2]
            .into_iter()
            .filter(|&v| v < cols.min(8))
            .map(|v| Layout::blocked_in_runs(rows, cols, v))
            .find(|l| !l.rows_replicated())
            .unwrap_or(wide)
    }

    /// The blocked layout of a `rows×cols` tile in runs of `v` columns a thread.
    fn blocked_in_runs(rows: u32, cols: u32, v: u32) -> Layout {
        // Lanes along the columns: a power of two dividing the v-column runs (all of them, up
        // to 32, for a power-of-two width; 2 for 176 = 22 runs of 8).
        let tc = (1 << (cols / v).trailing_zeros()).min(32);
        let tr = 32 / tc;
        let mut wr = (rows / tr).clamp(1, 4);
        let mut wc = 4 / wr;
        // A width that is not a power of two (2304, 176): as many warps
        // along the columns as divide it; the others hold row replicas.
        while wc > 1 && !cols.is_power_of_two() && !cols.is_multiple_of(v * tc * wc) {
            wc /= 2;
            wr *= 2;
        }
        Layout::full(rows, cols, LayoutKind::Blocked { v, tc, tr, wc, wr })
    }

    /// The wgmma accumulator layout of a `rows×cols` tile (`rows` a multiple of 64, `cols` of 8).
    pub fn wgmma(rows: u32, cols: u32) -> Layout {
        Layout::full(rows, cols, LayoutKind::Wgmma { m_blocks: rows / 64 })
    }

    fn full(rows: u32, cols: u32, kind: LayoutKind) -> Layout {
        Layout { rows, cols, parent_rows: rows, parent_cols: cols, kind, keep_rows: true, keep_cols: true }
    }

    /// Rows covered by one pass of the warpgroup.
    pub fn footprint_rows(&self) -> u32 {
        match self.kind {
            LayoutKind::Blocked { tr, wr, .. } => tr * wr,
            LayoutKind::Wgmma { .. } => 64,
        }
    }

    /// Columns covered by one pass of the warpgroup.
    pub fn footprint_cols(&self) -> u32 {
        match self.kind {
            LayoutKind::Blocked { v, tc, wc, .. } => v * tc * wc,
            LayoutKind::Wgmma { .. } => 8,
        }
    }

    /// Consecutive columns a thread holds in consecutive slots (a vector access's run).
    pub fn run_len(&self) -> u32 {
        if !self.keep_cols {
            return 1;
        }
        match self.kind {
            LayoutKind::Blocked { v, .. } => v,
            LayoutKind::Wgmma { .. } => 2,
        }
    }

    /// The parent's registers, in register order.
    fn parent_slots(&self) -> Vec<Slot> {
        let mut out = Vec::new();
        match self.kind {
            LayoutKind::Blocked { v, .. } => {
                let (fr, fc) = (self.footprint_rows(), self.footprint_cols());
                for i in 0..(self.parent_rows / fr).max(1) {
                    for j in 0..(self.parent_cols / fc).max(1) {
                        for k in 0..v {
                            out.push(Slot { dr: i * fr, dc: j * fc + k });
                        }
                    }
                }
            }
            LayoutKind::Wgmma { m_blocks } => {
                for b in 0..m_blocks {
                    for i in 0..self.parent_cols / 2 {
                        out.push(Slot { dr: 64 * b + 8 * ((i >> 1) & 1), dc: 8 * (i >> 2) + (i & 1) });
                    }
                }
            }
        }
        out
    }

    /// Every register of a thread: the parent's, projected onto the kept axes, first
    /// occurrences in register order.
    pub fn slots(&self) -> Vec<Slot> {
        let mut out: Vec<Slot> = Vec::new();
        for s in self.parent_slots() {
            let p = self.project(s);
            if !out.contains(&p) {
                out.push(p);
            }
        }
        out
    }

    fn project(&self, s: Slot) -> Slot {
        Slot { dr: if self.keep_rows { s.dr } else { 0 }, dc: if self.keep_cols { s.dc } else { 0 } }
    }

    /// Registers per thread.
    pub fn len(&self) -> usize {
        self.slots().len()
    }

    /// Whether a thread holds no register (never: every layout has at least one).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The layout after reducing `axis` (0: down the rows, 1: along each row).
    pub fn reduced(&self, axis: u32) -> Layout {
        if axis == 1 {
            Layout { cols: 1, keep_cols: false, ..*self }
        } else {
            Layout { rows: 1, keep_rows: false, ..*self }
        }
    }

    /// The layout that a `rows×cols` operand needs to broadcast against a tile of this layout
    /// for free.
    pub fn broadcast_operand(&self, rows: u32, cols: u32) -> Layout {
        Layout { rows, cols, keep_rows: self.keep_rows && rows != 1, keep_cols: self.keep_cols && cols != 1, ..*self }
    }

    /// For register `slot` of this layout, the register of `operand` (a broadcast operand from
    /// [`Layout::broadcast_operand`]) that holds the same row and column.
    pub fn broadcast_slot(&self, slot: usize, operand: &Layout) -> usize {
        let s = operand.project(self.slots()[slot]);
        operand.slots().iter().position(|&o| o == s).unwrap_or(0)
    }

    /// Whether the footprint holds the rows more than once (threads hold replicas).
    pub fn rows_replicated(&self) -> bool {
        self.footprint_rows() > self.parent_rows
    }

    /// Whether the footprint holds the columns more than once.
    pub fn cols_replicated(&self) -> bool {
        self.footprint_cols() > self.parent_cols
    }

    /// How the lanes of a warp split along `axis` (0: rows, 1: columns): the lane-index
    /// stride between neighbours along it and how many lanes there are.
    pub fn lane_split(&self, axis: u32) -> (u32, u32) {
        match (self.kind, axis) {
            (LayoutKind::Blocked { tc, .. }, 1) => (1, tc),
            (LayoutKind::Blocked { tc, tr, .. }, _) => (tc, tr),
            (LayoutKind::Wgmma { .. }, 1) => (1, 4),
            (LayoutKind::Wgmma { .. }, _) => (4, 8),
        }
    }

    /// How many warps split along `axis`.
    pub fn warp_split(&self, axis: u32) -> u32 {
        match (self.kind, axis) {
            (LayoutKind::Blocked { wc, .. }, 1) => wc,
            (LayoutKind::Blocked { wr, .. }, _) => wr,
            (LayoutKind::Wgmma { .. }, 1) => 1,
            (LayoutKind::Wgmma { .. }, _) => 4,
        }
    }

    /// The tile coordinates of each register of thread `t` (0 along an axis not kept).
    fn elements(&self, t: u32) -> Vec<(u32, u32)> {
        let (ur, uc) = self.unwrapped_base(t);
        self.slots()
            .iter()
            .map(|s| {
                let r = if self.keep_rows { ur % self.parent_rows + s.dr } else { 0 };
                let c = if self.keep_cols { uc % self.parent_cols + s.dc } else { 0 };
                (r, c)
            })
            .collect()
    }

    /// If every thread's registers in layout `to` are registers it holds in this layout, at
    /// the same register index in every thread, the index in this layout of each register
    /// of `to`: the conversion is then a renaming.
    pub fn local_map(&self, to: &Layout) -> Option<Vec<usize>> {
        let mut map: Vec<Option<usize>> = vec![None; to.len()];
        for t in 0..128 {
            let have = self.elements(t);
            for (j, e) in to.elements(t).iter().enumerate() {
                let i = have.iter().position(|h| h == e)?;
                match map[j] {
                    Some(prev) if prev != i => return None,
                    _ => map[j] = Some(i),
                }
            }
        }
        map.into_iter().collect()
    }

    /// The thread's unwrapped base row and column, for thread `t` of the warpgroup; the base
    /// is these modulo the parent's extent. Mirrors what lowering computes in PTX.
    pub fn unwrapped_base(&self, t: u32) -> (u32, u32) {
        let (lane, warp) = (t % 32, t / 32);
        match self.kind {
            LayoutKind::Blocked { v, tc, tr, wc, .. } => (lane / tc + (warp / wc) * tr, (lane % tc + (warp % wc) * tc) * v),
            LayoutKind::Wgmma { .. } => (16 * warp + lane / 4, 2 * (lane % 4)),
        }
    }
}

/// Where element `(r, c)` of an f32 MMA accumulator `cols` wide lies in *fragment order*, as
/// `store_fragments` writes it and `load_fragments` reads it: thread `t`'s register `i` (in
/// the m64nN fragment's order, 64-row blocks one after another) at element
/// `((i / 4)·128 + t)·4 + i % 4` — each thread's registers four at a time, a warp's quads
/// side by side.
pub fn fragment_offset(cols: u32, r: u32, c: u32) -> u32 {
    let (b, rr) = (r / 64, r % 64);
    let t = 32 * (rr / 16) + 4 * (rr % 8) + (c % 8) / 2;
    let i = b * (cols / 2) + 4 * (c / 8) + 2 * ((rr % 16) / 8) + c % 2;
    ((i / 4) * 128 + t) * 4 + i % 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragment_order_is_the_registers_order() {
        for (rows, cols) in [(64, 64), (64, 32), (128, 24), (64, 8)] {
            let l = Layout::wgmma(rows, cols);
            let mut seen = vec![false; (rows * cols) as usize];
            for t in 0..128 {
                let (r0, c0) = l.unwrapped_base(t);
                for (i, s) in l.slots().iter().enumerate() {
                    let at = fragment_offset(cols, r0 + s.dr, c0 + s.dc);
                    assert_eq!(at, ((i as u32 / 4) * 128 + t) * 4 + i as u32 % 4, "{rows}x{cols} thread {t} register {i}");
                    assert!(!std::mem::replace(&mut seen[at as usize], true));
                }
            }
        }
    }

    /// Every element of the tile is owned by exactly one (thread, slot).
    fn owners(l: &Layout) -> Vec<u32> {
        let mut count = vec![0u32; (l.rows * l.cols) as usize];
        for t in 0..128u32 {
            let (ur, uc) = l.unwrapped_base(t);
            let row_owner = if l.keep_rows { ur < l.parent_rows } else { ur == 0 };
            let col_owner = if l.keep_cols { uc < l.parent_cols } else { uc == 0 };
            if !(row_owner && col_owner) {
                continue;
            }
            for s in l.slots() {
                let r = if l.keep_rows { (ur % l.parent_rows) + s.dr } else { 0 };
                let c = if l.keep_cols { (uc % l.parent_cols) + s.dc } else { 0 };
                count[(r * l.cols + c) as usize] += 1;
            }
        }
        count
    }

    #[test]
    fn every_element_has_one_owner() {
        let mut layouts = Vec::new();
        let odd =
            [(1, 5120), (2, 3072), (4, 2304), (1, 2304), (2, 2304), (16, 768), (1, 11008), (1, 48), (16, 48), (64, 176), (4, 176), (1, 24)];
        for &(m, n) in [(1, 1), (1, 8), (16, 256), (32, 128), (64, 1), (4, 4), (128, 64), (2, 1024)].iter().chain(&odd) {
            layouts.push(Layout::blocked(m, n));
        }
        for &(m, n) in &[(64, 8), (64, 256), (128, 128), (64, 160), (64, 176), (64, 192)] {
            layouts.push(Layout::wgmma(m, n));
        }
        for l in layouts {
            assert!(owners(&l).iter().all(|&c| c == 1), "{l:?}");
            assert!(owners(&l.reduced(1)).iter().all(|&c| c == 1), "{l:?} row-reduced");
            assert!(owners(&l.reduced(0)).iter().all(|&c| c == 1), "{l:?} col-reduced");
        }
    }

    #[test]
    fn widths_not_a_power_of_two_split_the_warps_as_far_as_they_divide() {
        // 5120 = 5 × 1024: four warps along the columns, five runs each.
        let l = Layout::blocked(1, 5120);
        assert_eq!((l.footprint_cols(), l.len()), (1024, 40));
        // 2304 = 9 × 256: in runs of 8 one warp along the columns, the other three replicas;
        // in runs of 2 the four warps along the columns, 18 columns a thread.
        let l = Layout::blocked(1, 2304);
        assert_eq!((l.footprint_cols(), l.footprint_rows(), l.len(), l.run_len()), (256, 1, 18, 2));
        assert!(!l.rows_replicated());
        // 4608 = 9 × 512: runs of 4.
        let l = Layout::blocked(1, 4608);
        assert_eq!((l.footprint_cols(), l.len(), l.run_len()), (512, 36, 4));
        // Four rows of 2304: a warp per row, nothing replicated.
        let l = Layout::blocked(4, 2304);
        assert_eq!((l.footprint_cols(), l.len(), l.rows_replicated()), (256, 72, false));
        // 176 = 22 runs of 8: 2 lanes along the columns (22's power-of-two part), 16 along the
        // rows, the warps stacked on the rows; 11 runs a thread.
        let l = Layout::blocked(64, 176);
        assert_eq!((l.footprint_cols(), l.footprint_rows(), l.len()), (16, 64, 88));
        let l = Layout::blocked(1, 48);
        assert_eq!((l.footprint_cols(), l.len()), (16, 24));
        assert!(l.rows_replicated());
    }

    #[test]
    fn a_row_broadcast_against_its_tile_is_a_renaming() {
        let big = Layout::blocked(32, 64);
        let map = Layout::blocked(1, 64).local_map(&big.broadcast_operand(1, 64));
        assert_eq!(map, Some((0..8).collect()));
        // A column vector's elements are spread differently: it moves through shared memory.
        assert_eq!(Layout::blocked(32, 1).local_map(&big.broadcast_operand(32, 1)), None);
    }

    #[test]
    fn wgmma_slots_follow_the_accumulator_fragment() {
        // d[i]: row = 16w + g + 8*((i>>1)&1), col = 8*(i>>2) + 2t + (i&1)
        let l = Layout::wgmma(64, 16);
        let s = l.slots();
        assert_eq!(s.len(), 8);
        assert_eq!(s[0], Slot { dr: 0, dc: 0 });
        assert_eq!(s[1], Slot { dr: 0, dc: 1 });
        assert_eq!(s[2], Slot { dr: 8, dc: 0 });
        assert_eq!(s[5], Slot { dr: 0, dc: 9 });
        assert_eq!(l.unwrapped_base(37), (16 + 1, 2));
    }
}
