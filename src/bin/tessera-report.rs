//! `tessera-report`: what to do with the JSON results `cargo bench` writes under
//! `target/tessera-bench/` (see `tessera::report`).
//!
//! ```text
//! tessera-report html <result.json>... [-o report.html]     one page, a section per architecture
//! tessera-report compare <old.json> <new.json> [--threshold 5]   ratios that fell by more than 5%: exit 1
//! tessera-report ncu <result.json> <ncu.csv>                 Nsight Compute's figures into the results
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tessera::report::{self, Report};

const USAGE: &str = "usage:
  tessera-report html <result.json>... [-o report.html]
  tessera-report compare <old.json> <new.json> [--threshold PERCENT]   (default 5; exit 1 if a ratio fell by more)
  tessera-report ncu <result.json> <ncu.csv>   (ncu --csv --metrics <tessera::report::NCU_METRICS> over the same bench)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tessera-report: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let Some((command, rest)) = args.split_first() else { return Err(USAGE.into()) };
    match command.as_str() {
        "html" => {
            let (mut inputs, mut out) = (Vec::new(), PathBuf::from("target/tessera-bench/report.html"));
            let mut it = rest.iter();
            while let Some(a) = it.next() {
                if a == "-o" {
                    out = it.next().map(PathBuf::from).ok_or("-o needs a file name")?;
                } else {
                    inputs.push(load(Path::new(a))?);
                }
            }
            if inputs.is_empty() {
                return Err(format!("html needs at least one result file\n{USAGE}"));
            }
            std::fs::write(&out, report::html(&inputs)).map_err(|e| format!("{}: {e}", out.display()))?;
            println!("wrote {} ({} runs, {} rows)", out.display(), inputs.len(), inputs.iter().map(|r| r.records.len()).sum::<usize>());
            Ok(ExitCode::SUCCESS)
        }
        "compare" => {
            let [old, new, more @ ..] = rest else { return Err(format!("compare needs two result files\n{USAGE}")) };
            let threshold = match more {
                [] => 5.0,
                [flag, v] if flag == "--threshold" => {
                    v.parse::<f64>().map_err(|_| format!("--threshold expects a percentage, got `{v}`"))?
                }
                other => return Err(format!("compare: unexpected arguments {other:?}\n{USAGE}")),
            };
            let (old, new) = (load(Path::new(old))?, load(Path::new(new))?);
            let changes = report::compare(&old, &new, threshold / 100.0);
            println!("{} → {} ({} rows in both; flagged: fell by more than {threshold}%)", old.commit, new.commit, changes.len());
            let mut fell = 0;
            for c in &changes {
                let mark = if c.fell { "FELL" } else { "" };
                fell += usize::from(c.fell);
                println!("{mark:<5} {:<70} {:>7.3} → {:>7.3} ({:+.1}%)", c.row, c.old, c.new, 100.0 * (c.new / c.old - 1.0));
            }
            println!("{fell} fell");
            Ok(if fell > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
        }
        "ncu" => {
            let [result, csv] = rest else { return Err(format!("ncu needs a result file and a CSV\n{USAGE}")) };
            let mut r = load(Path::new(result))?;
            let text = std::fs::read_to_string(csv).map_err(|e| format!("{csv}: {e}"))?;
            let n = r.merge_ncu(&text).map_err(|e| e.to_string())?;
            let text = serde_json_text(&r)?;
            std::fs::write(result, text).map_err(|e| format!("{result}: {e}"))?;
            println!("{result}: Nsight Compute figures added to {n} rows");
            Ok(ExitCode::SUCCESS)
        }
        other => Err(format!("unknown command `{other}`\n{USAGE}")),
    }
}

fn load(path: &Path) -> Result<Report, String> {
    Report::load(path).map_err(|e| e.to_string())
}

fn serde_json_text(r: &Report) -> Result<String, String> {
    r.to_json().map_err(|e| e.to_string())
}
