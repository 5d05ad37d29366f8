//! `TileQueue`: indices claimed at run time from a global counter, handed from a block's
//! producer warpgroup to its consumers through a ring of shared slots.
//!
//! Shared memory: `stages` full barriers (one arrival: the producer's leader), `stages` empty
//! barriers (one arrival per consumer warpgroup), then `stages` 4-byte slots.
//!
//! Producer (`for t in q.fetch(total)`): the leader draws an index by adding 1 to the counter
//! (`atom.global.add`) before the loop; per index: wait until the slot is empty (every thread,
//! then the warpgroup's barrier: see `ring_wait`); the leader
//! writes the drawn value to the slot (−1 once it reaches `total`), arrives on the slot's full
//! barrier (a release: the slot's value is visible to whoever sees the phase complete) and
//! issues the next draw, whose latency then hides behind the body; the warpgroup syncs and
//! every thread reads the slot. Each block's producer draws exactly one value ≥ `total`, so the draw that returns
//! `total + blocks − 1` is the grid's last: that leader writes the counter back to 0, ready for
//! the next launch on the stream.
//!
//! Consumer (`for t in q.take()`), per index: wait until the slot is full, read it, sync the
//! warpgroup (all have read), and the leader arrives on the slot's empty barrier.
//!
//! Either loop leaves when the slot holds −1. The producer's warpgroup barrier also keeps its
//! slower threads' reads ahead of the leader's next write to the same slot (that write comes
//! one full lap later, after another barrier).

use super::{Lowerer, Value};
use crate::dtype::ScalarType;
use crate::error::CompileError;
use crate::tirh::{Expr, Stmt};
use crate::tirt::{Inst, Operand, Reg, RegClass};

/// A queue's barriers, slots and per-thread ring state.
#[derive(Clone, Debug)]
pub(crate) struct QueueVal {
    pub(crate) ring: super::hopper::Ring,
    /// Byte offset of the slots from the dynamic base.
    slots: u32,
    counter: String,
}

impl Lowerer<'_> {
    /// Allocates a queue's barriers and slots (`TileQueue::<stages>::new(counter, consumers)`).
    pub(crate) fn queue_new(&mut self, stages: u32, consumers: u32, counter: &str) -> Value {
        // The leader's one arrival fills a slot (sm_90a and sm_80 alike: no copies count).
        let ring = self.barrier_ring(stages, 1, consumers);
        let slots = self.dyn_bytes;
        self.dyn_bytes = slots + 4 * stages;
        Value::Queue(QueueVal { ring, slots, counter: counter.to_string() })
    }

    /// `for var in queue.fetch(total)` (`total` is `Some`) or `for var in queue.take()`.
    pub(crate) fn queue_for(&mut self, var: &str, queue: &str, total: Option<&Expr>, body: &[Stmt]) -> Result<(), CompileError> {
        use Operand::{Imm, Reg as R, Sym};
        let Value::Queue(q) = self.lookup(queue) else { unreachable!("verified TIR-H: `{queue}` is a tile queue") };
        let total = match total {
            Some(t) => {
                let t = self.scalar(t)?;
                Some(self.in_reg(t, ScalarType::I32, "total"))
            }
            None => None,
        };
        let leader = self.leader;
        // The producer's first draw, before the loop: each later draw is issued as soon as the
        // previous index is published, so its latency hides behind the body.
        let drawn = match total {
            Some(total) => {
                let g = self.global(&q.counter);
                let ptr = self.global_regs(&g).ptr;
                let v = self.reg(RegClass::B32, "drawn");
                self.op_if(leader, false, "atom.global.add.u32", vec![R(v), Operand::Addr(ptr, 0), Imm(1)]);
                // The grid's last draw (`total + blocks - 1`) puts the counter back to 0.
                let last = self.reg(RegClass::B32, "last");
                self.grid_blocks(last);
                self.op("add.u32", vec![R(last), R(last), R(total)]);
                self.op("sub.u32", vec![R(last), R(last), Imm(1)]);
                Some((ptr, v, last))
            }
            None => None,
        };
        let (head, exit) = (self.label("queue"), self.label("endqueue"));
        self.body.push(Inst::Label(head.clone()));
        let base = self.dyn_base();
        let slot = self.reg(RegClass::B32, "slot");
        self.op("mad.lo.u32", vec![R(slot), R(q.ring.stage), Imm(4), R(base)]);
        let i = self.reg(RegClass::B32, var);
        match (total, drawn) {
            (Some(total), Some((ptr, v, last))) => {
                self.ring_wait(q.ring, true);
                let more = self.reg(RegClass::Pred, "more");
                self.op("setp.lt.s32", vec![R(more), R(v), R(total)]);
                let publish = self.reg(RegClass::B32, "publish");
                self.op("selp.b32", vec![R(publish), R(v), Imm(-1), R(more)]);
                self.op_if(leader, false, "st.shared.u32", vec![Operand::Addr(slot, i64::from(q.slots)), R(publish)]);
                self.ring_arrive(q.ring.full, q.ring.stage);
                let reset = self.reg(RegClass::Pred, "reset");
                self.op("setp.eq.and.u32", vec![R(reset), R(v), R(last), R(leader)]);
                self.op_if(reset, false, "st.global.u32", vec![Operand::Addr(ptr, 0), Imm(0)]);
                // The next draw, while this index's body runs.
                let again = self.reg(RegClass::Pred, "again");
                self.op("and.pred", vec![R(again), R(more), R(leader)]);
                self.op_if(again, false, "atom.global.add.u32", vec![R(v), Operand::Addr(ptr, 0), Imm(1)]);
                self.warpgroup_barrier();
                self.op("ld.shared.u32", vec![R(i), Operand::Addr(slot, i64::from(q.slots))]);
            }
            _ => {
                self.ring_wait(q.ring, false);
                self.op("ld.shared.u32", vec![R(i), Operand::Addr(slot, i64::from(q.slots))]);
                self.warpgroup_barrier();
                self.ring_arrive(q.ring.empty, q.ring.stage);
            }
        }
        self.ring_advance(q.ring);
        let done = self.reg(RegClass::Pred, "drained");
        self.op("setp.lt.s32", vec![R(done), R(i), Imm(0)]);
        self.op_if(done, false, "bra.uni", vec![Sym(exit.clone())]);
        self.scopes.push(std::collections::HashMap::new());
        self.bind(var, Value::Scalar(R(i), ScalarType::I32));
        self.block(body)?;
        self.scopes.pop();
        self.op("bra.uni", vec![Sym(head)]);
        self.body.push(Inst::Label(exit));
        Ok(())
    }

    /// `%nctaid.x · %nctaid.y · %nctaid.z` into `out`.
    fn grid_blocks(&mut self, out: Reg) {
        use Operand::{Reg as R, Sym};
        let t = self.reg(RegClass::B32, "nctaid");
        self.op("mov.u32", vec![R(out), Sym("%nctaid.x".into())]);
        for axis in ["%nctaid.y", "%nctaid.z"] {
            self.op("mov.u32", vec![R(t), Sym(axis.into())]);
            self.op("mul.lo.u32", vec![R(out), R(out), R(t)]);
        }
    }
}
