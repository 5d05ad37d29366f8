//! Bench results as data: what `cargo bench` measured, written as JSON under
//! `target/tessera-bench/`, rendered as a self-contained HTML report per architecture, and
//! compared between two runs (a ratio that fell by more than a threshold is flagged).
//!
//! A bench makes a [`Report`] (its device, architecture, driver and commit), pushes one
//! [`Record`] per measured row — the kernel, shape and dtype, our time and rate, the baseline
//! measured in the same run and the ratio to it, the roofline where there is one — and
//! [`Report::write`]s it. While a report is open every launch is noted, so each record carries
//! the kernels its row launched and their [`LaunchFigures`] (registers, shared memory, blocks an
//! SM from the driver). [`Report::merge_ncu`] adds Nsight Compute's figures from a CSV that
//! `ncu` wrote for the same bench. The `tessera-report` command of the workspace does the rest:
//! `tessera-report html target/tessera-bench/*.json -o report.html`,
//! `tessera-report compare old.json new.json`, `tessera-report ncu report.json ncu.csv`.

use crate::{Device, Error, KernelSpec, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};

/// One measured row.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The bench that measured it (`memory_bound`, `gemm`, `attention`).
    pub bench: String,
    /// The kernel family (`gemm`, `attention`, `norm`, `scan`, …), the report's sections.
    pub family: String,
    /// What ran (`cumsum`, `rms_norm`, `flash_attention causal`).
    pub kernel: String,
    /// Its shape, as the bench names it (`16384x8192`, `B4 H16 N4096 d128`).
    pub shape: String,
    /// Element type (`bf16`, `f32`, `e4m3`).
    pub dtype: String,
    /// `tessera`, or a peer measured in the same run for comparison (`torch`, `mamba`, `fla`).
    pub source: String,
    /// Milliseconds a call (CUDA events, after warm-up).
    pub ms: f64,
    /// The rate's unit: `GB/s` or `TFLOP/s`.
    pub unit: String,
    /// The rate.
    pub value: f64,
    /// The baseline measured in the same run (`copy`, `cuBLAS`, `cuDNN`), if any.
    pub baseline: Option<String>,
    /// The baseline's rate, in `unit`.
    pub baseline_value: Option<f64>,
    /// `value / baseline_value`: above 1, faster than the baseline.
    pub ratio: Option<f64>,
    /// The roofline in `unit` (the copy bandwidth for memory-bound kernels), if any.
    pub roofline: Option<f64>,
    /// The kernel entries the row launched.
    #[serde(default)]
    pub entries: Vec<String>,
    /// Each entry's registers, shared memory and occupancy.
    #[serde(default)]
    pub launch: Vec<LaunchFigures>,
    /// Nsight Compute's figures for the entries ([`Report::merge_ncu`]).
    #[serde(default)]
    pub ncu: Vec<NcuFigures>,
}

impl Record {
    /// A row of `family`: `kernel` at `shape` in `dtype`, run by Tessera, `ms` a call at
    /// `value` `unit`.
    pub fn new(family: &str, kernel: &str, shape: &str, dtype: &str, ms: f64, unit: &str, value: f64) -> Record {
        Record {
            family: family.into(),
            kernel: kernel.into(),
            shape: shape.into(),
            dtype: dtype.into(),
            source: "tessera".into(),
            ms,
            unit: unit.into(),
            value,
            ..Record::default()
        }
    }

    /// The baseline `name` measured in the same run at `value` (in this record's unit); sets
    /// the ratio.
    pub fn against(mut self, name: &str, value: f64) -> Record {
        self.baseline = Some(name.into());
        self.baseline_value = Some(value);
        self.ratio = (value > 0.0).then(|| self.value / value);
        self
    }

    /// The roofline, in this record's unit.
    pub fn roofline(mut self, value: f64) -> Record {
        self.roofline = Some(value);
        self
    }

    /// Measured by a peer (`torch`, `mamba`, `fla`), not by Tessera.
    pub fn source(mut self, source: &str) -> Record {
        self.source = source.into();
        self
    }

    /// What identifies the row between two runs.
    fn key(&self) -> (&str, &str, &str, &str, &str) {
        (&self.bench, &self.kernel, &self.shape, &self.dtype, &self.source)
    }
}

/// A kernel entry's resources, as the driver reports them for the loaded module.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchFigures {
    /// The PTX entry.
    pub entry: String,
    /// Threads a block.
    pub threads: u32,
    /// Registers a thread.
    pub registers: u32,
    /// Static shared memory a block, bytes.
    pub static_shared: u32,
    /// Dynamic shared memory a block, bytes.
    pub dynamic_shared: u32,
    /// Blocks that fit an SM at once.
    pub blocks_per_sm: u32,
}

/// Nsight Compute's figures for one kernel entry (averages over its profiled launches).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NcuFigures {
    /// The PTX entry.
    pub entry: String,
    /// DRAM throughput, % of peak (`dram__throughput.avg.pct_of_peak_sustained_elapsed`).
    pub dram_pct: Option<f64>,
    /// SMs active, % of cycles (`sm__cycles_active.avg` over elapsed, as ncu's percentage).
    pub sm_active_pct: Option<f64>,
    /// Tensor pipes active, % of peak (`sm__pipe_tensor_op_hmma_cycles_active`).
    pub tensor_active_pct: Option<f64>,
}

/// The metrics to ask `ncu` for, in `--metrics` form, for [`Report::merge_ncu`].
pub const NCU_METRICS: &str = "dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active";

/// One bench run on one device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The bench.
    pub bench: String,
    /// The device's name (`NVIDIA H100 80GB HBM3`).
    pub device: String,
    /// Its architecture (`sm_90`).
    pub arch: String,
    /// The driver's CUDA version (`13.0`).
    pub driver: String,
    /// The commit measured (`TESSERA_COMMIT`, else `git rev-parse --short HEAD`, else `unknown`).
    pub commit: String,
    /// When, in seconds since 1970.
    pub unix_time: u64,
    /// The rows.
    pub records: Vec<Record>,
}

/// Whether launches are noted, and those noted since the last [`Report::push`].
static NOTING: AtomicBool = AtomicBool::new(false);
static NOTED: Mutex<Vec<&'static KernelSpec>> = Mutex::new(Vec::new());
/// The driver's figures of the entries seen so far, by device and entry: asked once each.
static FIGURES: LazyLock<Mutex<HashMap<(String, &'static str), LaunchFigures>>> = LazyLock::new(Default::default);

/// Notes a launch of `spec` while a report is open (one relaxed load otherwise).
pub(crate) fn note_launch(spec: &'static KernelSpec) {
    if NOTING.load(Ordering::Relaxed) {
        let mut noted = NOTED.lock().unwrap_or_else(|p| p.into_inner());
        if !noted.iter().any(|s| std::ptr::eq(*s, spec)) {
            noted.push(spec);
        }
    }
}

fn io_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Report(format!("{}: {e}", path.display()))
}

impl Report {
    /// A report of `bench` on `device`; from now on this process's launches are noted (a lock
    /// a launch: for benches), for the records' kernels.
    pub fn new(bench: &str, device: &Device) -> Report {
        let (major, minor) = device.compute_capability();
        NOTING.store(true, Ordering::Relaxed);
        NOTED.lock().unwrap_or_else(|p| p.into_inner()).clear();
        Report {
            bench: bench.into(),
            device: device.name().into(),
            arch: format!("sm_{major}{minor}"),
            driver: driver_version(),
            commit: commit(),
            unix_time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            records: Vec::new(),
        }
    }

    /// Adds a row, with the kernels launched since the previous row (their figures read from
    /// `device` where it is a GPU).
    pub fn push(&mut self, device: &Device, mut record: Record) {
        let noted = std::mem::take(&mut *NOTED.lock().unwrap_or_else(|p| p.into_inner()));
        record.bench = self.bench.clone();
        let mut known = FIGURES.lock().unwrap_or_else(|p| p.into_inner());
        for spec in noted {
            record.entries.push(spec.name.to_string());
            let key = (device.name().to_string(), spec.name);
            if !known.contains_key(&key) {
                if let Ok(figures) = device.launch_figures(spec) {
                    known.insert(key.clone(), figures);
                }
            }
            record.launch.extend(known.get(&key).cloned());
        }
        self.records.push(record);
    }

    /// Forgets the launches noted since the last row (warm-up, setup).
    pub fn skip_launches(&self) {
        NOTED.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Where [`Report::write`] puts it: `$TESSERA_BENCH_OUT` or `target/tessera-bench`, file
    /// `<bench>-<arch>.json`.
    pub fn path(&self) -> PathBuf {
        let dir = std::env::var_os("TESSERA_BENCH_OUT").map_or_else(|| PathBuf::from("target/tessera-bench"), PathBuf::from);
        dir.join(format!("{}-{}.json", self.bench, self.arch))
    }

    /// Writes the report as JSON to [`Report::path`] and returns the path.
    ///
    /// # Errors
    /// [`Error::Report`] where the folder or the file cannot be written.
    pub fn write(&self) -> Result<PathBuf> {
        let path = self.path();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
        }
        std::fs::write(&path, self.to_json()?).map_err(|e| io_error(&path, e))?;
        Ok(path)
    }

    /// The report as pretty-printed JSON.
    ///
    /// # Errors
    /// [`Error::Report`] where a figure cannot be written as JSON (a NaN rate).
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self).map_err(|e| Error::Report(format!("{}: {e}", self.bench)))
    }

    /// Reads a report [`Report::write`] wrote.
    ///
    /// # Errors
    /// [`Error::Report`] where the file cannot be read or is not a report.
    pub fn load(path: &Path) -> Result<Report> {
        let text = std::fs::read_to_string(path).map_err(|e| io_error(path, e))?;
        serde_json::from_str(&text).map_err(|e| io_error(path, format!("not a bench report: {e}")))
    }

    /// Adds Nsight Compute's figures from `csv`, the output of `ncu --csv --metrics
    /// <NCU_METRICS>` over this bench (`--page raw` or the default details page: rows with
    /// "Kernel Name", "Metric Name", "Metric Value"), to the records that launched each
    /// kernel; a kernel's launches are averaged. Returns how many records got figures.
    ///
    /// # Errors
    /// [`Error::Report`] where the CSV has no such columns.
    pub fn merge_ncu(&mut self, csv: &str) -> Result<usize> {
        let figures = parse_ncu(csv)?;
        let mut touched = 0;
        for r in &mut self.records {
            let found: Vec<NcuFigures> = r.entries.iter().filter_map(|e| figures.iter().find(|f| &f.entry == e).cloned()).collect();
            if !found.is_empty() {
                r.ncu = found;
                touched += 1;
            }
        }
        Ok(touched)
    }
}

/// The driver's CUDA version, `major.minor` (`unknown` without a driver).
fn driver_version() -> String {
    if !crate::driver_present() {
        return "unknown".into();
    }
    let mut v = 0i32;
    // SAFETY: a plain query that writes one int; the library is loaded (checked above).
    let ok = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if ok == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        format!("{}.{}", v / 1000, (v % 1000) / 10)
    } else {
        "unknown".into()
    }
}

/// `TESSERA_COMMIT`, else the checkout's short hash, else `unknown`.
fn commit() -> String {
    if let Ok(c) = std::env::var("TESSERA_COMMIT") {
        return c;
    }
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Splits one CSV line (quoted fields, `""` inside quotes).
fn csv_fields(line: &str) -> Vec<String> {
    let (mut out, mut field, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    out.push(field);
    out
}

/// Each kernel's averages of the three metrics in an `ncu --csv` report.
fn parse_ncu(csv: &str) -> Result<Vec<NcuFigures>> {
    let mut lines = csv.lines().filter(|l| l.starts_with('"'));
    let header = lines.next().map(csv_fields).unwrap_or_default();
    let col = |name: &str| header.iter().position(|h| h == name);
    let (Some(kernel), Some(metric), Some(value)) = (col("Kernel Name"), col("Metric Name"), col("Metric Value")) else {
        return Err(Error::Report(format!(
            "ncu CSV: expected columns \"Kernel Name\", \"Metric Name\", \"Metric Value\" (ncu --csv --metrics ...), got {header:?}"
        )));
    };
    // (entry, metric index) → (sum, count)
    let mut sums: Vec<(String, [(f64, u32); 3])> = Vec::new();
    for line in lines {
        let f = csv_fields(line);
        let (Some(k), Some(m), Some(v)) = (f.get(kernel), f.get(metric), f.get(value)) else { continue };
        let Some(i) = ["dram__throughput", "sm__cycles_active", "sm__pipe_tensor_op_hmma"].iter().position(|p| m.starts_with(p)) else {
            continue;
        };
        let Ok(v) = v.replace(',', "").parse::<f64>() else { continue };
        // ncu names a kernel by its entry, maybe with a parameter list.
        let entry = k.split('(').next().unwrap_or(k).trim().to_string();
        let at = match sums.iter().position(|(e, _)| *e == entry) {
            Some(at) => at,
            None => {
                sums.push((entry, [(0.0, 0); 3]));
                sums.len() - 1
            }
        };
        sums[at].1[i].0 += v;
        sums[at].1[i].1 += 1;
    }
    let avg = |(s, n): (f64, u32)| (n > 0).then(|| s / f64::from(n));
    Ok(sums
        .into_iter()
        .map(|(entry, m)| NcuFigures { entry, dram_pct: avg(m[0]), sm_active_pct: avg(m[1]), tensor_active_pct: avg(m[2]) })
        .collect())
}

/// A row whose ratio to its baseline fell (or rose) between two runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// `bench / kernel shape dtype (source)`.
    pub row: String,
    /// The ratio in the old run.
    pub old: f64,
    /// The ratio in the new run.
    pub new: f64,
    /// Whether it fell by more than the threshold.
    pub fell: bool,
}

/// The rows of `new` that `old` also has, with their ratios to the baseline (or, for rows
/// without a baseline, their rates) before and after; `fell` where the new is lower than the
/// old by more than `threshold` (0.05: 5%).
pub fn compare(old: &Report, new: &Report, threshold: f64) -> Vec<Change> {
    let old: HashMap<_, &Record> = old.records.iter().map(|o| (o.key(), o)).collect();
    let mut out = Vec::new();
    for n in &new.records {
        let Some(o) = old.get(&n.key()) else { continue };
        let (a, b) = match (o.ratio, n.ratio) {
            (Some(a), Some(b)) => (a, b),
            _ => (o.value, n.value),
        };
        let row = format!("{} / {} {} {} ({})", n.bench, n.kernel, n.shape, n.dtype, n.source);
        out.push(Change { row, old: a, new: b, fell: b < a * (1.0 - threshold) });
    }
    out
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A horizontal bar chart in SVG: one bar per `(label, value)`, a rule at `mark` (1.0 for
/// ratios), values up to `max`.
fn bar_chart(rows: &[(String, f64)], mark: Option<f64>, max: f64, suffix: &str) -> String {
    let (label_w, bar_w, row_h) = (330.0, 420.0, 18.0);
    let height = row_h * rows.len() as f64 + 24.0;
    let x = |v: f64| label_w + bar_w * (v / max).clamp(0.0, 1.0);
    let mut svg =
        format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" font-size=\"11\">", label_w + bar_w + 70.0);
    for (i, (label, v)) in rows.iter().enumerate() {
        let y = 4.0 + row_h * i as f64;
        let color = match mark {
            Some(m) if *v < m * 0.9 => "#d9534f",
            Some(m) if *v < m => "#f0ad4e",
            _ => "#5cb85c",
        };
        svg += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text><rect x=\"{label_w}\" y=\"{y}\" width=\"{}\" height=\"{}\" fill=\"{color}\"/><text x=\"{}\" y=\"{}\">{v:.2}{suffix}</text>",
            label_w - 6.0,
            y + 12.0,
            html_escape(label),
            x(*v) - label_w,
            row_h - 4.0,
            x(*v) + 4.0,
            y + 12.0
        );
    }
    if let Some(m) = mark {
        svg += &format!(
            "<line x1=\"{0}\" x2=\"{0}\" y1=\"0\" y2=\"{1}\" stroke=\"#333\" stroke-dasharray=\"4 2\"/><text x=\"{0}\" y=\"{2}\">{m}</text>",
            x(m),
            height - 14.0,
            height - 2.0
        );
    }
    svg + "</svg>"
}

/// A self-contained HTML page (inline CSS and SVG, no scripts): a section per architecture,
/// in it one per kernel family with a chart of each row's ratio to its baseline, a chart of
/// its rate against the roofline where there is one, and a table of every figure.
pub fn html(reports: &[Report]) -> String {
    let mut archs: Vec<&str> = reports.iter().map(|r| r.arch.as_str()).collect();
    archs.sort_unstable();
    archs.dedup();
    let mut page = String::from(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Tessera bench report</title><style>\
         body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;font-size:12px;margin:1em 0}\
         td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child,th:first-child{text-align:left}\
         h2{border-bottom:2px solid #333}.small{color:#666;font-size:12px}</style></head><body><h1>Tessera bench report</h1>",
    );
    for arch in archs {
        let runs: Vec<&Report> = reports.iter().filter(|r| r.arch == arch).collect();
        page += &format!("<h2>{}</h2><p class=\"small\">", html_escape(arch));
        for r in &runs {
            page += &format!(
                "{}: {} · driver {} · commit {} · {} rows<br>",
                html_escape(&r.bench),
                html_escape(&r.device),
                html_escape(&r.driver),
                html_escape(&r.commit),
                r.records.len()
            );
        }
        page += "</p>";
        let records: Vec<&Record> = runs.iter().flat_map(|r| &r.records).collect();
        let mut families: Vec<&str> = records.iter().map(|r| r.family.as_str()).collect();
        families.sort_unstable();
        families.dedup();
        for family in families {
            let rows: Vec<&&Record> = records.iter().filter(|r| r.family == family).collect();
            page += &format!("<h3>{}</h3>", html_escape(family));
            let label = |r: &Record| format!("{} {} {}{}", r.kernel, r.shape, r.dtype, if r.source == "tessera" { "" } else { " *" });
            let ratios: Vec<(String, f64)> = rows.iter().filter_map(|r| Some((label(r), r.ratio?))).collect();
            if !ratios.is_empty() {
                let baselines: Vec<&str> = rows.iter().filter_map(|r| r.baseline.as_deref()).collect();
                let mut names = baselines.clone();
                names.sort_unstable();
                names.dedup();
                let max = ratios.iter().map(|(_, v)| *v).fold(1.2, f64::max);
                page += &format!(
                    "<p class=\"small\">Ratio to the baseline measured in the same run ({}); * a peer's row.</p>",
                    html_escape(&names.join(", "))
                );
                page += &bar_chart(&ratios, Some(1.0), max, "×");
            }
            let roof: Vec<(String, f64)> =
                rows.iter().filter_map(|r| Some((format!("{} ({})", label(r), r.unit), 100.0 * r.value / r.roofline?))).collect();
            if !roof.is_empty() {
                page += "<p class=\"small\">Rate as % of the roofline.</p>";
                page += &bar_chart(&roof, None, 100.0, "%");
            }
            page += "<table><tr><th>kernel</th><th>shape</th><th>dtype</th><th>source</th><th>ms</th><th>rate</th><th>baseline</th><th>ratio</th><th>regs</th><th>smem (B)</th><th>blocks/SM</th><th>DRAM %</th><th>SM %</th><th>tensor %</th></tr>";
            for r in rows {
                let pct = |f: &dyn Fn(&NcuFigures) -> Option<f64>| {
                    let v: Vec<String> = r.ncu.iter().filter_map(f).map(|v| format!("{v:.0}")).collect();
                    v.join(" / ")
                };
                let launch = |f: &dyn Fn(&LaunchFigures) -> u32| r.launch.iter().map(|l| f(l).to_string()).collect::<Vec<_>>().join(" / ");
                page += &format!(
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.0} {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    html_escape(&r.kernel),
                    html_escape(&r.shape),
                    html_escape(&r.dtype),
                    html_escape(&r.source),
                    r.ms,
                    r.value,
                    html_escape(&r.unit),
                    html_escape(&r.baseline.clone().map(|b| format!("{b} {:.0}", r.baseline_value.unwrap_or(0.0))).unwrap_or_default()),
                    r.ratio.map(|v| format!("{v:.2}")).unwrap_or_default(),
                    launch(&|l| l.registers),
                    launch(&|l| l.static_shared + l.dynamic_shared),
                    launch(&|l| l.blocks_per_sm),
                    pct(&|n| n.dram_pct),
                    pct(&|n| n.sm_active_pct),
                    pct(&|n| n.tensor_active_pct),
                );
            }
            page += "</table>";
        }
    }
    page + "</body></html>"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(commit: &str, ratios: &[(&str, f64)]) -> Report {
        let records = ratios
            .iter()
            .map(|&(kernel, ratio)| {
                let mut r = Record::new("norm", kernel, "16384x8192", "bf16", 1.0, "GB/s", 3000.0 * ratio).against("copy", 3000.0);
                r.bench = "memory_bound".into();
                r.roofline(3000.0)
            })
            .collect();
        Report { bench: "memory_bound".into(), arch: "sm_90".into(), commit: commit.into(), records, ..Report::default() }
    }

    #[test]
    fn compare_flags_ratios_that_fell_past_the_threshold() {
        let old = run("a", &[("rms_norm", 0.90), ("layer_norm", 0.80), ("softmax", 0.95), ("gone", 1.0)]);
        let new = run("b", &[("rms_norm", 0.86), ("layer_norm", 0.77), ("softmax", 0.99), ("new", 1.0)]);
        let changes = compare(&old, &new, 0.05);
        assert_eq!(changes.len(), 3, "rows in both runs only: {changes:?}");
        let fell: Vec<&str> = changes.iter().filter(|c| c.fell).map(|c| c.row.as_str()).collect();
        // 0.90 → 0.86 is −4.4%: kept; 0.80 → 0.77 is −3.75%: kept; at 3% both fall.
        assert!(fell.is_empty(), "{fell:?}");
        let fell = compare(&old, &new, 0.03).into_iter().filter(|c| c.fell).count();
        assert_eq!(fell, 2);
    }

    #[test]
    fn json_round_trips() {
        let r = run("abc", &[("rms_norm", 0.9)]);
        let dir = std::env::temp_dir().join(format!("tessera-report-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("r.json");
        std::fs::write(&path, r.to_json().expect("json")).expect("write");
        assert_eq!(Report::load(&path).expect("load"), r);
        std::fs::write(&path, "{\"not\": 1}").expect("write");
        let err = Report::load(&path).expect_err("not a report").to_string();
        assert!(err.contains("not a bench report"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn ncu_csv_figures_reach_the_records_that_launched_them() {
        let mut r = run("abc", &[("rms_norm", 0.9), ("softmax", 0.95)]);
        r.records[0].entries = vec!["rms_norm_row_bf16__w8192".into()];
        let csv = "==PROF== Connected\n\
            \"ID\",\"Process ID\",\"Kernel Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n\
            \"0\",\"1\",\"rms_norm_row_bf16__w8192\",\"dram__throughput.avg.pct_of_peak_sustained_elapsed\",\"%\",\"90.5\"\n\
            \"0\",\"1\",\"rms_norm_row_bf16__w8192\",\"sm__cycles_active.avg.pct_of_peak_sustained_elapsed\",\"%\",\"70\"\n\
            \"1\",\"1\",\"rms_norm_row_bf16__w8192\",\"dram__throughput.avg.pct_of_peak_sustained_elapsed\",\"%\",\"91.5\"\n\
            \"2\",\"1\",\"other\",\"dram__throughput.avg.pct_of_peak_sustained_elapsed\",\"%\",\"1,000\"\n";
        assert_eq!(r.merge_ncu(csv).expect("merge"), 1);
        let f = &r.records[0].ncu[0];
        assert_eq!((f.dram_pct, f.sm_active_pct, f.tensor_active_pct), (Some(91.0), Some(70.0), None));
        assert!(r.records[1].ncu.is_empty());
        let err = r.merge_ncu("\"a\",\"b\"\n").expect_err("no ncu columns").to_string();
        assert!(err.contains("Kernel Name"), "{err}");
    }

    #[test]
    fn html_has_a_section_per_architecture_and_family() {
        let mut a = run("abc", &[("rms_norm", 0.9)]);
        let mut b = run("abc", &[("softmax", 1.1)]);
        b.arch = "sm_100".into();
        b.records[0].family = "softmax".into();
        a.records[0].kernel = "<odd & name>".into();
        let page = html(&[a, b]);
        for part in ["<h2>sm_100</h2>", "<h2>sm_90</h2>", "<h3>norm</h3>", "<h3>softmax</h3>", "&lt;odd &amp; name&gt;", "<svg"] {
            assert!(page.contains(part), "missing {part}");
        }
        assert!(!page.contains("<script"), "self-contained and static");
    }
}
