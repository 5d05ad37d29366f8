//! Choosing the fastest of a kernel's variants: exhaustive search, or Hyperband — successive
//! halving run in several brackets, each trading how many candidates it starts with against
//! how many repetitions it first gives each (Li et al., 2018). Repetitions are the resource:
//! a candidate timed over more launches is timed more surely.

use crate::Result;

/// Times candidate `index` over `reps` launches and gives the mean seconds per launch.
///
/// The GPU timer ([`crate::tune::launch_timer`]) launches the variant on scratch outputs
/// between CUDA events; tests plant a landscape with a fake one.
pub trait Timer {
    /// Mean seconds per launch of candidate `index` over `reps` launches.
    ///
    /// # Errors
    /// The launch's; a candidate that fails is left out of the search.
    fn time(&mut self, index: usize, reps: u32) -> Result<f64>;
}

impl<F: FnMut(usize, u32) -> Result<f64>> Timer for F {
    fn time(&mut self, index: usize, reps: u32) -> Result<f64> {
        self(index, reps)
    }
}

/// How the tuner searches a knob space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Every candidate, each over `reps` launches.
    Exhaustive {
        /// Launches per candidate.
        reps: u32,
    },
    /// Hyperband: brackets of successive halving; the most eager bracket starts every
    /// candidate at one launch and keeps the best `1/eta` at `eta` times the launches, up to
    /// `max_reps`.
    Hyperband {
        /// The launches a finalist is timed over.
        max_reps: u32,
        /// The halving rate (3 is the usual).
        eta: u32,
    },
}

impl Default for Strategy {
    fn default() -> Self {
        Strategy::Hyperband { max_reps: 27, eta: 3 }
    }
}

impl Strategy {
    /// A short name, stored beside each result.
    pub fn name(&self) -> String {
        match self {
            Strategy::Exhaustive { reps } => format!("exhaustive(reps={reps})"),
            Strategy::Hyperband { max_reps, eta } => format!("hyperband(max_reps={max_reps},eta={eta})"),
        }
    }

    /// The launches this search would make at most over `n` candidates (for a progress bar).
    pub fn budget(&self, n: usize) -> u64 {
        match *self {
            Strategy::Exhaustive { reps } => n as u64 * u64::from(reps.max(1)),
            Strategy::Hyperband { max_reps, eta } => {
                let hb = brackets(n, max_reps, eta).iter().map(|b| b.rounds().map(|(n, r)| n as u64 * u64::from(r)).sum::<u64>()).sum();
                let ex = Strategy::Exhaustive { reps: max_reps }.budget(n);
                u64::min(hb, ex)
            }
        }
    }

    /// What runs for `n` candidates: Hyperband over so few that it would cost more than timing
    /// each at `max_reps` is that exhaustive search.
    pub(crate) fn for_candidates(self, n: usize) -> Strategy {
        match self {
            Strategy::Hyperband { max_reps, .. } if Strategy::Exhaustive { reps: max_reps }.budget(n) <= self.budget(n) => {
                Strategy::Exhaustive { reps: max_reps }
            }
            s => s,
        }
    }
}

/// What a search found.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchResult {
    /// The fastest candidate.
    pub best: usize,
    /// Its mean seconds per launch, at the most launches it was timed over.
    pub best_seconds: f64,
    /// Each candidate's last timing and how many launches it was over (`None`: never timed, or
    /// its launch failed).
    pub timings: Vec<Option<(f64, u32)>>,
    /// Launches made in all, over every candidate.
    pub launches: u64,
}

/// Timings so far: a candidate timed over at least as many launches is not timed again.
struct Memo<'t> {
    timer: &'t mut dyn Timer,
    timings: Vec<Option<(f64, u32)>>,
    failed: Vec<bool>,
    launches: u64,
    progress: &'t mut dyn FnMut(u64),
}

impl Memo<'_> {
    /// Seconds per launch of `i` over at least `reps` launches; `None` if its launch fails.
    fn time(&mut self, i: usize, reps: u32) -> Option<f64> {
        if self.failed[i] {
            return None;
        }
        if let Some((t, r)) = self.timings[i] {
            if r >= reps {
                return Some(t);
            }
        }
        let reps = reps.max(1);
        self.launches += u64::from(reps);
        (self.progress)(u64::from(reps));
        match self.timer.time(i, reps) {
            Ok(t) if t.is_finite() => {
                self.timings[i] = Some((t, reps));
                Some(t)
            }
            _ => {
                self.failed[i] = true;
                None
            }
        }
    }

    /// Times every candidate of `set` over `reps` launches; the timed ones, fastest first.
    fn rank(&mut self, set: &[usize], reps: u32) -> Vec<(usize, f64)> {
        let mut timed: Vec<(usize, f64)> = set.iter().filter_map(|&i| self.time(i, reps).map(|t| (i, t))).collect();
        timed.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        timed
    }
}

/// One bracket of Hyperband: `n` candidates at `reps` launches, then halving by `eta`.
struct Bracket {
    n: usize,
    reps: u32,
    eta: u32,
    max_reps: u32,
}

impl Bracket {
    /// `(candidates, launches each)` of each round.
    fn rounds(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        let eta = self.eta.max(2);
        std::iter::successors(Some((self.n, self.reps)), move |&(n, r)| {
            (r < self.max_reps && n > 1).then(|| (n.div_ceil(eta as usize), (r * eta).min(self.max_reps)))
        })
    }
}

/// Hyperband's brackets for `n` candidates: bracket `s` starts `⌈(s_max+1)/(s+1)·ηˢ⌉`
/// candidates (at most `n`) at `max_reps/ηˢ` launches — except the most eager, which starts
/// all `n`: a knob space is small and finite, so every candidate is seen at least once.
fn brackets(n: usize, max_reps: u32, eta: u32) -> Vec<Bracket> {
    let eta = eta.max(2);
    let max_reps = max_reps.max(1);
    let mut s_max = 0u32;
    while eta.saturating_pow(s_max + 1) <= max_reps {
        s_max += 1;
    }
    (0..=s_max)
        .rev()
        .map(|s| {
            let want = ((s_max + 1) as f64 / (s + 1) as f64 * f64::from(eta.pow(s))).ceil() as usize;
            let n = if s == s_max { n } else { want.min(n).max(1) };
            Bracket { n, reps: (max_reps / eta.pow(s)).max(1), eta, max_reps }
        })
        .collect()
}

/// A fixed-seed xorshift: which candidates a bracket starts with, the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    /// `k` distinct candidates of `0..n`, `first` among them (the default is always tried).
    fn sample(&mut self, n: usize, k: usize, first: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..n).collect();
        all.swap(0, first.min(n - 1));
        for i in 1..n {
            let j = i + self.below(n - i);
            all.swap(i, j);
        }
        all.truncate(k);
        all
    }
}

/// Searches `n` candidates with `strategy`; `default` is always among those timed. Gives
/// `None` when no candidate could be timed.
///
/// `progress` is told how many launches each timing makes.
pub fn search(n: usize, default: usize, strategy: Strategy, timer: &mut dyn Timer, progress: &mut dyn FnMut(u64)) -> Option<SearchResult> {
    if n == 0 {
        return None;
    }
    let mut memo = Memo { timer, timings: vec![None; n], failed: vec![false; n], launches: 0, progress };
    let all: Vec<usize> = (0..n).collect();
    let (best, best_seconds) = match strategy.for_candidates(n) {
        Strategy::Exhaustive { reps } => memo.rank(&all, reps).first().copied()?,
        Strategy::Hyperband { max_reps, eta } => {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
            let mut finalists = Vec::new();
            for b in brackets(n, max_reps, eta) {
                let mut set = rng.sample(n, b.n, default);
                for (keep, reps) in b.rounds() {
                    set.truncate(keep);
                    set = memo.rank(&set, reps).into_iter().map(|(i, _)| i).collect();
                }
                finalists.extend(set.first().copied());
            }
            // Every bracket ends at `max_reps`: compare the finalists there.
            memo.rank(&finalists, max_reps.max(1)).first().copied()?
        }
    };
    Some(SearchResult { best, best_seconds, timings: memo.timings, launches: memo.launches })
}
