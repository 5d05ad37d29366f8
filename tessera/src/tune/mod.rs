//! Autotuning: which variant of a kernel runs for a given launch.
//!
//! A kernel with `tune(BN = [256, 128], STAGES = [4, 3])` has one compiled variant per
//! combination of its knobs (`VARIANTS` in its module, each with its knob values in
//! [`KernelSpec::knobs`](crate::KernelSpec::knobs)). A library function that launches it builds
//! a [`TuneKey`] (the device, the operation, dtypes, shapes, strides, the candidates) and asks
//! the [`Tuner`] which candidate to run. The tuner answers from memory, then from its SQLite
//! [`Cache`], and — only in [`TuneMode::Search`] — by timing the candidates on the real
//! arguments ([`Timer`]; outputs go to scratch buffers), exhaustively or by Hyperband
//! ([`Strategy`]), keeping the winner in the cache.
//!
//! `TESSERA_TUNE` sets the mode of the process-wide tuner ([`Tuner::global`]):
//!
//! | value | what happens |
//! |---|---|
//! | `off` | the kernel's default heuristic, the cache never read |
//! | `replay` (default) | the cache's choice where it has one, else the default heuristic; never times anything (CI, production) |
//! | `search` | as `replay`, and a key the cache lacks is timed once, with a progress bar, and stored |
//!
//! The cache file is `$TESSERA_CACHE_DIR/schedules.sqlite`, or `tessera/schedules.sqlite` in
//! the platform's cache directory (`~/.cache` on Linux).

mod cache;
mod search;

pub use cache::{Cache, Entry, SCHEMA_VERSION};
pub use search::{search, SearchResult, Strategy, Timer};

use crate::{Device, Error, Result};
use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Whether the tuner reads its cache and whether it times candidates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TuneMode {
    /// The default heuristic; no cache.
    Off,
    /// The cache where it has an answer, else the default heuristic; never times.
    #[default]
    Replay,
    /// As replay, and a new key is timed once and stored.
    Search,
}

impl TuneMode {
    /// Parses `off`, `replay` or `search`.
    ///
    /// # Errors
    /// [`Error::TuneMode`] for anything else.
    pub fn parse(s: &str) -> Result<TuneMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Ok(TuneMode::Off),
            "replay" | "" => Ok(TuneMode::Replay),
            "search" => Ok(TuneMode::Search),
            _ => Err(Error::TuneMode(s.to_string())),
        }
    }
}

/// What a tuning decision depends on: the device, the operation, each field added (dtype,
/// shape, strides, options) and the candidates. Fields are hashed as they are added; their
/// text (the cache's key) is written only when the tuner has not seen the key in this process,
/// so that a launch whose decision is known pays a few hashes, not a string.
#[derive(Clone)]
pub struct TuneKey<'a> {
    op: &'static str,
    arch: (i32, i32),
    device: &'a str,
    fields: Vec<(&'static str, &'a dyn Debug)>,
    hasher: DefaultHasher,
}

impl<'a> TuneKey<'a> {
    /// A key for operation `op` on `device` (its name and compute capability).
    pub fn new(op: &'static str, device: &'a Device) -> TuneKey<'a> {
        let (arch, name) = (device.compute_capability(), device.name());
        let mut hasher = DefaultHasher::new();
        (op, arch, name).hash(&mut hasher);
        TuneKey { op, arch, device: name, fields: Vec::with_capacity(8), hasher }
    }

    /// Adds a field: `key.field("shape", &[m, n, k])`.
    pub fn field<V: Debug + Hash>(mut self, name: &'static str, value: &'a V) -> TuneKey<'a> {
        (name, value).hash(&mut self.hasher);
        self.fields.push((name, value));
        self
    }

    /// The operation.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// The key as stored: `op=gemm;arch=sm_90;device=…;shape=[…];…;space=<candidates>` (a
    /// change of the knob space makes a new key).
    pub fn text(&self, candidates: &[&str]) -> String {
        let (major, minor) = self.arch;
        let mut t = format!("op={};arch=sm_{major}{minor};device={}", self.op, self.device);
        for (name, value) in &self.fields {
            t += &format!(";{name}={value:?}");
        }
        t + ";space=" + &candidates.join(",")
    }

    /// The hash of the key with `candidates`, for the tuner's memory.
    fn hash_with(&self, candidates: &[&str]) -> u64 {
        let mut h = self.hasher.clone();
        candidates.hash(&mut h);
        h.finish()
    }
}

/// Chooses among a kernel's variants; see the [module docs](self).
pub struct Tuner {
    mode: TuneMode,
    strategy: Strategy,
    cache: Option<Cache>,
    /// The process-wide tuner's cache file, opened when first needed: for reading only if it
    /// exists (a replaying process makes no file), for writing by the first search.
    lazy_path: Option<PathBuf>,
    /// Decisions made or read in this process, by the key's hash: its text and the chosen
    /// name (`None`: the cache has none, so the default runs until a search).
    memo: HashMap<u64, (String, Option<String>)>,
    /// Searches run by this tuner (for tests and reports).
    searches: u64,
}

impl Tuner {
    /// A tuner in `mode` with no cache file: decisions last as long as it does.
    pub fn in_memory(mode: TuneMode) -> Tuner {
        Tuner { mode, strategy: Strategy::default(), cache: None, lazy_path: None, memo: HashMap::new(), searches: 0 }
    }

    /// A tuner in `mode` on the cache file at `path` (made if missing; moved aside and
    /// remade if unusable).
    ///
    /// # Errors
    /// [`Error::Cache`] when no cache can be made at `path`.
    pub fn open(path: impl Into<PathBuf>, mode: TuneMode) -> Result<Tuner> {
        let cache = Cache::open(&path.into())?;
        Ok(Tuner { cache: Some(cache), ..Tuner::in_memory(mode) })
    }

    /// The cache file the process-wide tuner uses: `$TESSERA_CACHE_DIR/schedules.sqlite`, or
    /// `tessera/schedules.sqlite` under the platform's cache directory.
    pub fn default_path() -> Option<PathBuf> {
        let dir = match std::env::var_os("TESSERA_CACHE_DIR") {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => dirs::cache_dir()?.join("tessera"),
        };
        Some(dir.join("schedules.sqlite"))
    }

    /// The process-wide tuner, made on first use from `TESSERA_TUNE`, with the cache file at
    /// [`Tuner::default_path`] opened when first needed (replaying reads a file that exists and
    /// never makes one). A bad `TESSERA_TUNE` is a warning and the tuner replays; a cache that
    /// cannot be made is a warning and the tuner goes on without a file.
    pub fn global() -> MutexGuard<'static, Tuner> {
        static GLOBAL: OnceLock<Mutex<Tuner>> = OnceLock::new();
        let m = GLOBAL.get_or_init(|| {
            let mode = TuneMode::parse(&std::env::var("TESSERA_TUNE").unwrap_or_default()).unwrap_or_else(|e| {
                eprintln!("tessera: warning: {e}; replaying the cache");
                TuneMode::Replay
            });
            Mutex::new(Tuner { lazy_path: Tuner::default_path(), ..Tuner::in_memory(mode) })
        });
        // A panic while tuning leaves nothing half-written that matters: keep going.
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The mode.
    pub fn mode(&self) -> TuneMode {
        self.mode
    }

    /// Sets the mode (the decisions already made stay).
    pub fn set_mode(&mut self, mode: TuneMode) {
        self.mode = mode;
    }

    /// The search strategy (default: Hyperband, 27 launches for a finalist, η = 3).
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Sets the search strategy.
    pub fn set_strategy(&mut self, strategy: Strategy) {
        self.strategy = strategy;
    }

    /// The cache file, if this tuner has one (the process-wide tuner opens or makes its file
    /// here if it has not yet).
    pub fn cache(&mut self) -> Option<&Cache> {
        self.open_cache(true)
    }

    /// Opens the process-wide tuner's file on first need: to `write`, or to read one that
    /// exists. A file that cannot be made is a warning, once; the tuner goes on without it.
    fn open_cache(&mut self, write: bool) -> Option<&Cache> {
        if self.cache.is_none() {
            if let Some(path) = self.lazy_path.take_if(|p| write || p.exists()) {
                match Cache::open(&path) {
                    Ok(c) => self.cache = Some(c),
                    Err(e) => eprintln!("tessera: warning: {e}; tuning without a cache file"),
                }
            }
        }
        self.cache.as_ref()
    }

    /// How many searches this tuner has run.
    pub fn searches(&self) -> u64 {
        self.searches
    }

    /// The decisions made or read in this process, by key: the chosen candidate's name, or
    /// `None` where the default ran for want of a cached answer.
    pub fn decisions(&self) -> Vec<(String, Option<String>)> {
        let mut d: Vec<_> = self.memo.values().cloned().collect();
        d.sort();
        d
    }

    /// Forgets the decisions held in memory (the cache file keeps them).
    pub fn forget(&mut self) {
        self.memo.clear();
    }

    /// Which of `candidates` (variant names) to run for `key`: `default` (the kernel's own
    /// heuristic) unless the cache or — in [`TuneMode::Search`] — a search says otherwise.
    /// `timer` is made only when a search runs.
    ///
    /// A candidate whose launch fails is left out of a search; if none can be timed, or the
    /// cache cannot be written, the default is used (with a warning for the cache).
    ///
    /// # Errors
    /// Only `timer`'s construction (e.g. allocating scratch outputs).
    pub fn choose<T: Timer>(
        &mut self, key: &TuneKey<'_>, candidates: &[&str], default: usize, timer: impl FnOnce() -> Result<T>,
    ) -> Result<usize> {
        let default = default.min(candidates.len().saturating_sub(1));
        if self.mode == TuneMode::Off || candidates.len() < 2 {
            return Ok(default);
        }
        let hash = key.hash_with(candidates);
        let position = |name: &str| candidates.iter().position(|c| *c == name);
        match self.memo.get(&hash).map(|(_, choice)| choice) {
            Some(Some(name)) => {
                if let Some(i) = position(name) {
                    return Ok(i);
                }
            }
            Some(None) if self.mode != TuneMode::Search => return Ok(default),
            _ => {}
        }
        let key_text = key.text(candidates);
        if let Some(cache) = self.open_cache(self.mode == TuneMode::Search) {
            match cache.get(&key_text) {
                Ok(Some(e)) => {
                    if let Some(i) = position(&e.choice) {
                        self.memo.insert(hash, (key_text, Some(e.choice)));
                        return Ok(i);
                    }
                }
                Ok(None) => {}
                Err(e) => eprintln!("tessera: warning: {e}"),
            }
        }
        if self.mode != TuneMode::Search {
            self.memo.insert(hash, (key_text, None));
            return Ok(default);
        }
        let mut timer = timer()?;
        let bar = indicatif::ProgressBar::new(self.strategy.budget(candidates.len()));
        bar.set_style(
            indicatif::ProgressStyle::with_template("tuning {msg} [{bar:30}] {pos}/{len} launches")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(key.op().to_string());
        let found = search(candidates.len(), default, self.strategy, &mut timer, &mut |n| bar.inc(n));
        bar.finish_and_clear();
        self.searches += 1;
        let Some(found) = found else { return Ok(default) };
        let choice = candidates[found.best].to_string();
        let strategy = self.strategy.for_candidates(candidates.len()).name();
        if let Some(cache) = self.open_cache(true) {
            let entry = Entry {
                key: key_text.clone(),
                op: key.op().to_string(),
                choice: choice.clone(),
                best_us: found.best_seconds * 1e6,
                default_us: found.timings[default].map(|(t, _)| t * 1e6),
                launches: found.launches,
                strategy,
            };
            if let Err(e) = cache.put(&entry) {
                eprintln!("tessera: warning: {e}");
            }
        }
        self.memo.insert(hash, (key_text, Some(choice)));
        Ok(found.best)
    }
}

/// A [`Timer`] that times `launch(index)` on `device` with CUDA events (wall-clock time on the
/// CPU interpreter), after one warm-up launch. `launch` should write only scratch buffers.
pub fn launch_timer<'d>(device: &'d Device, mut launch: impl FnMut(usize) -> Result<()> + 'd) -> impl Timer + 'd {
    move |index: usize, reps: u32| -> Result<f64> {
        launch(index)?;
        let mut failed = None;
        let ms = crate::testing::time_ms(device, 0, reps as usize, || {
            if let Err(e) = launch(index) {
                failed.get_or_insert(e);
            }
        })?;
        match failed {
            Some(e) => Err(e),
            None => Ok(ms * 1e-3),
        }
    }
}
