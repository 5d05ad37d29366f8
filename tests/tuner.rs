//! The autotuner: `tune(...)` variants, the search (on the interpreter, with a fake timer), the
//! SQLite schedule cache across processes, its recovery from bad files, concurrent writers.
//!
//! Tests that need a second process run this test binary again with `TESSERA_TUNER_CHILD`
//! set, selecting the `child_process` test, which does what the variable says.

mod common;

use common::random;
use std::path::{Path, PathBuf};
use std::process::Command;
use tessera::tune::{search, Cache, Entry, Strategy, Timer};
use tessera::{kernel, Device, Error, Grid, Tensor, TuneKey, TuneMode, Tuner};

/// `y = 2·x` in `H×W` tiles. `W = 36` is neither a power of two nor a multiple of 8: those
/// combinations are dropped at build time, leaving four variants.
#[kernel(tune(W = [64, 36, 32], H = [16, 32]))]
fn tuned_double(x: Global<f32, 2>, y: Global<f32, 2>) {
    let r = block::id_y() * H;
    let c = block::id_x() * W;
    let t: Tile<f32, H, W> = x.load([r, c]);
    y.store([r, c], t * 2.0);
}

/// `y = 2·x` again, over a wider knob space: 5 widths (a sixth, 36, is dropped) × 4 heights,
/// for Hyperband to search on the interpreter.
#[kernel(tune(W = [256, 128, 64, 36, 32, 16], H = [64, 32, 16, 8]))]
fn tuned_wide(x: Global<f32, 2>, y: Global<f32, 2>) {
    let r = block::id_y() * H;
    let c = block::id_x() * W;
    let t: Tile<f32, H, W> = x.load([r, c]);
    y.store([r, c], t * 2.0);
}

fn launch_double(dev: &Device, i: usize, x: &Tensor<f32>, y: &mut Tensor<f32>) -> tessera::Result<()> {
    let spec = tuned_double::VARIANTS[i];
    let (w, h) = (spec.knob("W").unwrap_or(64) as usize, spec.knob("H").unwrap_or(16) as usize);
    let grid = (Grid::tiles(x.shape()[1], w), Grid::tiles(x.shape()[0], h));
    tuned_double::launch_variant(i, dev, grid, x, y)
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-tuner-{name}-{}-{}", std::process::id(), random(1, 0.0, 1e9)[0] as u64));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

#[test]
fn variants_carry_their_knobs_and_impossible_ones_are_dropped() {
    let knobs: Vec<String> = tuned_double::VARIANTS.iter().map(|s| s.knobs_string()).collect();
    assert_eq!(knobs, ["W=64 H=16", "W=64 H=32", "W=32 H=16", "W=32 H=32"]);
    assert!(std::ptr::eq(tuned_double::VARIANTS[0], &tuned_double::SPEC), "the first variant is the default");
    let names: Vec<&str> = tuned_double::VARIANTS.iter().map(|s| s.name).collect();
    assert_eq!(names[1], "tuned_double__w64_h32");
    assert!(tuned_double::VARIANTS[3].has_knobs(&[("W", 32), ("H", 32)]));
    // Every variant computes the same thing.
    let dev = Device::cpu();
    let (m, n) = (37, 150);
    let xs = random(m * n, -1.0, 1.0);
    let x = Tensor::from_host(&dev, &xs, &[m, n]).unwrap();
    for i in 0..tuned_double::VARIANTS.len() {
        let mut y = Tensor::full(&dev, &[m, n], f32::NAN).unwrap();
        launch_double(&dev, i, &x, &mut y).unwrap();
        let got = y.to_host().unwrap();
        assert!(got.iter().zip(&xs).all(|(g, x)| *g == 2.0 * x), "variant {i}");
    }
    let mut y = Tensor::full(&dev, &[m, n], 0.0f32).unwrap();
    match tuned_double::launch_variant(4, &dev, 1u32, &x, &mut y) {
        Err(Error::Argument { arg, .. }) => assert_eq!(arg, "variant"),
        other => panic!("expected a variant error, got {other:?}"),
    }
}

/// A planted landscape over `n` candidates: `best` at 0.80, the rest between 1.0 and 1.5, with
/// deterministic noise that shrinks as `1/√reps`. Counts the launches asked for.
struct Landscape {
    best: usize,
    n: usize,
    launches: u64,
}

impl Landscape {
    fn truth(&self, i: usize) -> f64 {
        if i == self.best {
            0.80
        } else {
            1.0 + 0.5 * ((i * 37 + 11) % self.n) as f64 / self.n as f64
        }
    }
}

impl Timer for Landscape {
    fn time(&mut self, i: usize, reps: u32) -> tessera::Result<f64> {
        self.launches += u64::from(reps);
        let h = (i as u64 * 2654435761 + u64::from(reps) * 40503) % 1000;
        let noise = (h as f64 / 1000.0 - 0.5) * 0.3 / f64::from(reps).sqrt();
        Ok(self.truth(i) + noise)
    }
}

#[test]
fn hyperband_finds_the_planted_best_with_fewer_launches_than_exhaustive() {
    for (n, best) in [(81, 57), (12, 7), (5, 0), (2, 1)] {
        let mut ex = Landscape { best, n, launches: 0 };
        let e = search(n, 0, Strategy::Exhaustive { reps: 27 }, &mut ex, &mut |_| {}).expect("exhaustive result");
        let mut hb = Landscape { best, n, launches: 0 };
        let mut told = 0;
        let h = search(n, 0, Strategy::Hyperband { max_reps: 27, eta: 3 }, &mut hb, &mut |k| told += k).expect("hyperband result");
        assert_eq!(e.best, best, "exhaustive over {n}");
        assert_eq!(h.best, best, "hyperband over {n}");
        assert_eq!(told, hb.launches, "progress hears of every launch");
        assert_eq!(h.launches, hb.launches);
        assert!(hb.launches <= Strategy::Hyperband { max_reps: 27, eta: 3 }.budget(n));
        // Over so few candidates that halving costs more, Hyperband is exhaustive search.
        assert!(hb.launches <= ex.launches);
        if n >= 81 {
            assert!(hb.launches < ex.launches, "{n} candidates: hyperband {} launches, exhaustive {}", hb.launches, ex.launches);
        }
    }
}

#[test]
fn a_candidate_that_fails_is_left_out() {
    let mut timer = |i: usize, _reps: u32| -> tessera::Result<f64> {
        if i == 1 {
            Err(Error::NotCuda { what: "a planted failure" })
        } else {
            Ok(1.0 + i as f64)
        }
    };
    let r = search(3, 1, Strategy::default(), &mut timer, &mut |_| {}).expect("two candidates time");
    assert_eq!(r.best, 0);
    assert_eq!(r.timings[1], None);
    let mut all_fail = |_: usize, _: u32| -> tessera::Result<f64> { Err(Error::NotCuda { what: "a planted failure" }) };
    assert!(search(3, 0, Strategy::default(), &mut all_fail, &mut |_| {}).is_none());
}

/// The tuner on the interpreter: each timing launches the real variant on a scratch output
/// (checked) while a fake clock says how long it took; the caller's output is untouched.
#[test]
fn tuner_searches_on_the_interpreter_with_a_fake_timer() {
    let dev = Device::cpu();
    let (m, n) = (20, 70);
    let xs = random(m * n, -1.0, 1.0);
    let x = Tensor::from_host(&dev, &xs, &[m, n]).unwrap();
    let mut y = Tensor::full(&dev, &[m, n], f32::NAN).unwrap();
    let names: Vec<&str> = tuned_double::VARIANTS.iter().map(|s| s.name).collect();
    let planted = [3.0, 2.5, 1.5, 2.0];
    let shape = [m, n];
    let key = TuneKey::new("double", &dev).field("shape", &shape);
    let mut tuner = Tuner::in_memory(TuneMode::Search);
    let mut launches = 0;
    let (dev_ref, x_ref, xs_ref, launches_ref) = (&dev, &x, &xs, &mut launches);
    let choice = tuner
        .choose(&key, &names, 0, || {
            let mut scratch = Tensor::full(dev_ref, &[m, n], f32::NAN)?;
            Ok(move |i: usize, reps: u32| {
                launch_double(dev_ref, i, x_ref, &mut scratch)?;
                let got = scratch.to_host()?;
                assert!(got.iter().zip(xs_ref).all(|(g, x)| *g == 2.0 * x), "variant {i} on scratch");
                *launches_ref += reps;
                Ok(planted[i])
            })
        })
        .unwrap();
    assert_eq!(choice, 2, "the planted fastest");
    assert!(launches > 0);
    assert!(y.to_host().unwrap().iter().all(|v| v.is_nan()), "the caller's output is never written by the search");
    // Asked again, the answer comes from memory: no timer is made.
    let again = tuner.choose::<fn(usize, u32) -> tessera::Result<f64>>(&key, &names, 0, || panic!("no second search")).unwrap();
    assert_eq!(again, 2);
    assert_eq!(tuner.searches(), 1);
    launch_double(&dev, choice, &x, &mut y).unwrap();
    assert!(y.to_host().unwrap().iter().zip(&xs).all(|(g, x)| *g == 2.0 * x));
    // Off and replay never time.
    for mode in [TuneMode::Off, TuneMode::Replay] {
        let mut t = Tuner::in_memory(mode);
        let c = t.choose::<fn(usize, u32) -> tessera::Result<f64>>(&key, &names, 1, || panic!("{mode:?} never times")).unwrap();
        assert_eq!(c, 1, "{mode:?} gives the default");
    }
}

/// Hyperband through the `Tuner`, on the interpreter: every timing runs the variant (on a
/// scratch output, checked), a planted clock favours W=64, H=32; Hyperband finds it with fewer
/// launches than exhaustive search.
#[test]
fn hyperband_on_the_interpreter_beats_exhaustive_search() {
    let dev = Device::cpu();
    let (m, n) = (40, 300);
    let xs = random(m * n, -1.0, 1.0);
    let x = Tensor::from_host(&dev, &xs, &[m, n]).unwrap();
    let variants = tuned_wide::VARIANTS;
    assert_eq!(variants.len(), 20, "36 columns dropped");
    let names: Vec<&str> = variants.iter().map(|s| s.name).collect();
    let planted = |i: usize| {
        let (w, h) = (variants[i].knob("W").unwrap_or(0) as f64, variants[i].knob("H").unwrap_or(0) as f64);
        1.0 + (w.log2() - 6.0).abs() * 0.1 + (h.log2() - 5.0).abs() * 0.07
    };
    let mut launches = Vec::new();
    let mut choices = Vec::new();
    for strategy in [Strategy::Exhaustive { reps: 27 }, Strategy::Hyperband { max_reps: 27, eta: 3 }] {
        let mut tuner = Tuner::in_memory(TuneMode::Search);
        tuner.set_strategy(strategy);
        let mut count = 0u64;
        let count_ref = &mut count;
        let (dev_ref, x_ref, xs_ref) = (&dev, &x, &xs);
        let shape = [m, n];
        let key = TuneKey::new("wide", &dev).field("shape", &shape);
        let choice = tuner
            .choose(&key, &names, 0, || {
                let mut scratch = Tensor::full(dev_ref, &[m, n], f32::NAN)?;
                Ok(move |i: usize, reps: u32| {
                    let spec = variants[i];
                    let (w, h) = (spec.knob("W").unwrap_or(64) as usize, spec.knob("H").unwrap_or(16) as usize);
                    tuned_wide::launch_variant(i, dev_ref, (Grid::tiles(n, w), Grid::tiles(m, h)), x_ref, &mut scratch)?;
                    assert!(scratch.to_host()?.iter().zip(xs_ref).all(|(g, x)| *g == 2.0 * x), "variant {i}");
                    *count_ref += u64::from(reps);
                    Ok(planted(i))
                })
            })
            .unwrap();
        choices.push(choice);
        launches.push(count);
    }
    let best = (0..names.len()).min_by(|&a, &b| planted(a).total_cmp(&planted(b))).unwrap();
    assert_eq!(names[best], "tuned_wide__w64_h32");
    assert_eq!(choices, [best, best]);
    println!("hyperband {} launches, exhaustive {}", launches[1], launches[0]);
    assert!(launches[1] < launches[0], "hyperband {} launches, exhaustive {}", launches[1], launches[0]);
}

#[test]
fn tune_mode_parses_and_rejects() {
    assert_eq!(TuneMode::parse("off").unwrap(), TuneMode::Off);
    assert_eq!(TuneMode::parse(" Search ").unwrap(), TuneMode::Search);
    assert_eq!(TuneMode::parse("replay").unwrap(), TuneMode::Replay);
    let e = TuneMode::parse("fast").unwrap_err().to_string();
    assert!(e.contains("`off`, `replay` or `search`") && e.contains("fast"), "{e}");
}

const CANDIDATES: [&str; 4] = ["k__a", "k__b", "k__c", "k__d"];

fn planted_key(dev: &Device) -> TuneKey<'_> {
    TuneKey::new("planted", dev).field("shape", &[4096, 4096])
}

fn planted_timer() -> impl Timer {
    |i: usize, _: u32| Ok([4.0, 3.0, 1.0, 2.0][i])
}

fn never_timer() -> tessera::Result<fn(usize, u32) -> tessera::Result<f64>> {
    panic!("the cache should have answered")
}

/// Runs this binary's `child_process` test with `TESSERA_TUNER_CHILD=what`.
fn child(what: &str) -> std::process::Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "child_process", "--nocapture", "--test-threads=1"])
        .env("TESSERA_TUNER_CHILD", what)
        .spawn()
        .expect("spawn child")
}

/// What a child process does: `search <path>` tunes the planted key into the cache at `path`;
/// `replay <path>` must find it there; `write <path> <id>` writes 100 entries.
#[test]
fn child_process() {
    let Ok(what) = std::env::var("TESSERA_TUNER_CHILD") else { return };
    let parts: Vec<&str> = what.split('|').collect();
    let path = Path::new(parts[1]);
    match parts[0] {
        "search" => {
            let mut t = Tuner::open(path, TuneMode::Search).unwrap();
            assert_eq!(t.choose(&planted_key(&Device::cpu()), &CANDIDATES, 0, || Ok(planted_timer())).unwrap(), 2);
            assert_eq!(t.searches(), 1);
        }
        "replay" => {
            let mut t = Tuner::open(path, TuneMode::Replay).unwrap();
            assert_eq!(t.choose(&planted_key(&Device::cpu()), &CANDIDATES, 0, never_timer).unwrap(), 2);
        }
        "write" => {
            let cache = Cache::open(path).unwrap();
            for j in 0..100 {
                cache.put(&entry(&format!("{}-{j}", parts[2]), j as f64)).unwrap();
                assert!(cache.get(&format!("{}-{j}", parts[2])).unwrap().is_some());
            }
        }
        other => panic!("unknown child task {other}"),
    }
}

fn entry(key: &str, us: f64) -> Entry {
    Entry {
        key: key.into(),
        op: "test".into(),
        choice: "k__a".into(),
        best_us: us,
        default_us: Some(us * 2.0),
        launches: 3,
        strategy: "exhaustive(reps=1)".into(),
    }
}

#[test]
fn the_cache_persists_across_processes() {
    let dir = temp_dir("persist");
    let path = dir.join("schedules.sqlite");
    let arg = |what: &str| format!("{what}|{}", path.display());
    assert!(child(&arg("search")).wait().unwrap().success(), "the searching child");
    assert!(child(&arg("replay")).wait().unwrap().success(), "the replaying child");
    // And here, in a third process.
    let mut t = Tuner::open(&path, TuneMode::Search).unwrap();
    assert_eq!(t.choose(&planted_key(&Device::cpu()), &CANDIDATES, 0, never_timer).unwrap(), 2);
    assert_eq!(t.searches(), 0);
    let entries = t.cache().unwrap().entries().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].choice, "k__c");
    assert_eq!(entries[0].default_us, Some(4e6));
    // A different candidate list is a different key: replay falls back to the default.
    let mut r = Tuner::open(&path, TuneMode::Replay).unwrap();
    assert_eq!(r.choose(&planted_key(&Device::cpu()), &CANDIDATES[..3], 1, never_timer).unwrap(), 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn concurrent_writers_lose_nothing() {
    let dir = temp_dir("concurrent");
    let path = dir.join("schedules.sqlite");
    let mut children: Vec<_> = (0..4).map(|i| child(&format!("write|{}|p{i}", path.display()))).collect();
    // Threads of this process write too, each on its own connection.
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let path = path.clone();
            std::thread::spawn(move || {
                let cache = Cache::open(&path).unwrap();
                for j in 0..100 {
                    cache.put(&entry(&format!("t{i}-{j}"), j as f64)).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer thread");
    }
    for c in &mut children {
        assert!(c.wait().unwrap().success(), "a writing child failed");
    }
    let all = Cache::open(&path).unwrap().entries().unwrap();
    assert_eq!(all.len(), 800, "4 processes and 4 threads × 100 entries");
    let _ = std::fs::remove_dir_all(dir);
}

fn moved_aside(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".bad-")).count()
}

#[test]
fn a_corrupt_or_foreign_file_is_moved_aside_and_rebuilt() {
    let dir = temp_dir("corrupt");
    let path = dir.join("schedules.sqlite");
    // Not a database at all.
    std::fs::write(&path, b"this is not a database, it is a shopping list: eggs, flour, milk....").unwrap();
    let mut t = Tuner::open(&path, TuneMode::Search).unwrap();
    assert_eq!(moved_aside(&dir), 1);
    assert_eq!(t.choose(&planted_key(&Device::cpu()), &CANDIDATES, 0, || Ok(planted_timer())).unwrap(), 2);
    drop(t);
    assert_eq!(Cache::open(&path).unwrap().entries().unwrap().len(), 1, "the new cache works");

    // Another program's SQLite database.
    let foreign = dir.join("foreign.sqlite");
    {
        let c = rusqlite::Connection::open(&foreign).unwrap();
        c.execute_batch("CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT); INSERT INTO accounts VALUES (1, 'ada');").unwrap();
    }
    let c = Cache::open(&foreign).unwrap();
    assert!(c.entries().unwrap().is_empty());
    assert_eq!(moved_aside(&dir), 2);

    // Our file from another schema version.
    let old = dir.join("old.sqlite");
    Cache::open(&old).unwrap().put(&entry("x", 1.0)).unwrap();
    rusqlite::Connection::open(&old).unwrap().execute_batch("PRAGMA user_version = 99;").unwrap();
    assert!(Cache::open(&old).unwrap().entries().unwrap().is_empty());
    assert_eq!(moved_aside(&dir), 3);

    // A cache cut short (a full disk, a copy interrupted).
    let cut = dir.join("cut.sqlite");
    {
        let c = Cache::open(&cut).unwrap();
        for j in 0..2000 {
            c.put(&entry(&format!("key-{j:05}-{}", "x".repeat(40)), 1.0)).unwrap();
        }
    }
    let bytes = std::fs::read(&cut).unwrap();
    assert!(bytes.len() > 16384, "{} bytes", bytes.len());
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    let c = Cache::open(&cut).unwrap();
    c.put(&entry("after", 1.0)).unwrap();
    assert_eq!(c.entries().unwrap().len(), 1);
    assert_eq!(moved_aside(&dir), 4);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn export_and_import_round_trip_and_refuse_foreign_files() {
    let dir = temp_dir("export");
    let a = Cache::open(&dir.join("a.sqlite")).unwrap();
    for j in 0..10 {
        a.put(&entry(&format!("k{j}"), j as f64 + 1.0)).unwrap();
    }
    let out = dir.join("export.sqlite");
    a.export(&out).unwrap();
    let b = Cache::open(&dir.join("b.sqlite")).unwrap();
    b.put(&entry("k3", 0.5)).unwrap(); // faster than the import's: stays
    assert_eq!(b.import(&out).unwrap(), 10);
    let got = b.entries().unwrap();
    assert_eq!(got.len(), 10);
    assert_eq!(got.iter().find(|e| e.key == "k3").unwrap().best_us, 0.5);
    assert_eq!(got.iter().find(|e| e.key == "k7").unwrap(), &entry("k7", 8.0));
    // A foreign file is an error naming it, and is left as it was.
    let junk = dir.join("junk.sqlite");
    std::fs::write(&junk, b"junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk").unwrap();
    match b.import(&junk) {
        Err(Error::Cache { path, .. }) => assert!(path.contains("junk.sqlite")),
        other => panic!("expected a cache error, got {other:?}"),
    }
    assert!(std::fs::read(&junk).unwrap().starts_with(b"junk"));
    assert!(matches!(b.import(&dir.join("missing.sqlite")), Err(Error::Cache { .. })));
    let _ = std::fs::remove_dir_all(dir);
}
