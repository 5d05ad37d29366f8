//! Register layouts of tiles: which thread of a warpgroup holds which element.
//!
//! A tile `M×N` is spread over the 4 warps (128 threads) of a warpgroup in a *blocked*
//! layout: each thread holds runs of `v` consecutive columns; `tc` lanes of a warp cover
//! columns and `tr = 32 / tc` cover rows; `wc`×`wr` warps do the same one level up. The
//! footprint `fr×fc` repeats to cover the tile; where the tile is smaller than the footprint,
//! threads hold replicas, and only the *owner* of an element stores it or counts it in a sum.
//!
//! A reduction keeps the parent's layout and collapses an axis (`keep_rows`/`keep_cols`), so
//! that broadcasting the result back over its parent costs nothing: every thread already
//! holds the reduced value of each row (or column) it owns.
//!
//! Tile dimensions are powers of two, so every split below is exact.

/// A register layout: the blocked parameters of the parent tile and which axes are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Rows of the tile with this layout (1 if the rows were reduced).
    pub rows: u32,
    /// Columns of the tile with this layout (1 if the columns were reduced).
    pub cols: u32,
    /// Rows of the parent (blocked) tile.
    pub parent_rows: u32,
    /// Columns of the parent (blocked) tile.
    pub parent_cols: u32,
    /// Consecutive columns per thread.
    pub v: u32,
    /// Lanes along columns.
    pub tc: u32,
    /// Lanes along rows.
    pub tr: u32,
    /// Warps along columns.
    pub wc: u32,
    /// Warps along rows.
    pub wr: u32,
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
    /// The canonical blocked layout of a `rows×cols` tile.
    pub fn blocked(rows: u32, cols: u32) -> Layout {
        let v = cols.min(8);
        let tc = (cols / v).min(32);
        let tr = 32 / tc;
        let wr = (rows / tr).clamp(1, 4);
        let wc = 4 / wr;
        Layout { rows, cols, parent_rows: rows, parent_cols: cols, v, tc, tr, wc, wr, keep_rows: true, keep_cols: true }
    }

    /// Rows covered by one pass of the warpgroup.
    pub fn footprint_rows(&self) -> u32 {
        self.tr * self.wr
    }

    /// Columns covered by one pass of the warpgroup.
    pub fn footprint_cols(&self) -> u32 {
        self.v * self.tc * self.wc
    }

    /// Row offsets of a thread's registers.
    pub fn row_offsets(&self) -> Vec<u32> {
        if !self.keep_rows {
            return vec![0];
        }
        let fr = self.footprint_rows();
        (0..(self.parent_rows / fr).max(1)).map(|i| i * fr).collect()
    }

    /// Column offsets of a thread's registers.
    pub fn col_offsets(&self) -> Vec<u32> {
        if !self.keep_cols {
            return vec![0];
        }
        let fc = self.footprint_cols();
        let mut out = Vec::new();
        for j in 0..(self.parent_cols / fc).max(1) {
            for v in 0..self.v {
                out.push(j * fc + v);
            }
        }
        out
    }

    /// Every register of a thread, rows outer, columns inner.
    pub fn slots(&self) -> Vec<Slot> {
        let cols = self.col_offsets();
        let mut out = Vec::with_capacity(self.row_offsets().len() * cols.len());
        for dr in self.row_offsets() {
            for &dc in &cols {
                out.push(Slot { dr, dc });
            }
        }
        out
    }

    /// Registers per thread.
    pub fn len(&self) -> usize {
        self.row_offsets().len() * self.col_offsets().len()
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
        let ncols = self.col_offsets().len();
        let (ri, ci) = (slot / ncols, slot % ncols);
        let ri = if operand.keep_rows { ri } else { 0 };
        let ci = if operand.keep_cols { ci } else { 0 };
        ri * operand.col_offsets().len() + ci
    }

    /// Whether the footprint holds the rows more than once (threads hold replicas).
    pub fn rows_replicated(&self) -> bool {
        self.footprint_rows() > self.parent_rows
    }

    /// Whether the footprint holds the columns more than once.
    pub fn cols_replicated(&self) -> bool {
        self.footprint_cols() > self.parent_cols
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of the tile is owned by exactly one (thread, slot).
    fn owners(l: &Layout) -> Vec<u32> {
        let mut count = vec![0u32; (l.rows * l.cols) as usize];
        for t in 0..128u32 {
            let (lane, warp) = (t % 32, t / 32);
            let ur = lane / l.tc + (warp / l.wc) * l.tr;
            let uc = (lane % l.tc + (warp % l.wc) * l.tc) * l.v;
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
        for &(m, n) in &[(1, 1), (1, 8), (16, 256), (32, 128), (64, 1), (4, 4), (128, 64), (2, 1024)] {
            let l = Layout::blocked(m, n);
            assert!(owners(&l).iter().all(|&c| c == 1), "{m}x{n}: {l:?}");
            assert!(owners(&l.reduced(1)).iter().all(|&c| c == 1), "{m}x{n} row-reduced");
            assert!(owners(&l.reduced(0)).iter().all(|&c| c == 1), "{m}x{n} col-reduced");
        }
    }
}
