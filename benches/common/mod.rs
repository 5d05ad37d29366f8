//! What the benches and the `gemm_vs_cublas` example share: the cuBLAS baseline's call, the
//! tuner's temporary cache, a Python baseline in a child process.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use tessera::bf16;
use tessera::cudarc::cublas::{sys::cublasOperation_t, GemmConfig};

/// cuBLAS's column-major form of the row-major `C (M×N) = A (M×K) · B (N×K)ᵀ`: `Cᵀ = B·Aᵀ`
/// (pass B, then A).
#[allow(dead_code)]
pub fn cublas_tn(m: usize, n: usize, k: usize) -> GemmConfig<bf16> {
    GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha: bf16::ONE,
        lda: k as i32,
        ldb: k as i32,
        beta: bf16::ZERO,
        ldc: n as i32,
    }
}

/// Points the tuner's cache at a temporary folder unless `TESSERA_CACHE_DIR` is set, so that a
/// bench's searches never change what the user's processes replay. Call before any launch.
#[allow(dead_code)]
pub fn temporary_tune_cache() {
    if std::env::var_os("TESSERA_CACHE_DIR").is_none() {
        std::env::set_var("TESSERA_CACHE_DIR", std::env::temp_dir().join(format!("tessera-bench-{}", std::process::id())));
    }
}

/// A Python baseline (PyTorch's cuDNN attention, `torch._scaled_mm`) as a child process on the
/// same GPU, asked one line at a time so that its timing and ours run back to back, in the
/// same thermal state (the GPU clocks down under sustained load: timed after criterion's
/// second of it, ours read ~5% low, run 133). The script answers each line with one line:
/// its words, or `error <reason>` where its library is missing.
#[allow(dead_code)]
pub struct PyBaseline {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    script: String,
}

#[allow(dead_code)]
impl PyBaseline {
    /// `python3` on the script the variable `env` names, else on `file` found in `benches/`,
    /// the working folder or `bin/`.
    pub fn spawn(env: &str, file: &str) -> Result<PyBaseline, String> {
        let script = std::env::var(env).ok().unwrap_or_else(|| {
            [format!("benches/{file}"), file.to_string(), format!("bin/{file}")]
                .into_iter()
                .find(|p| std::path::Path::new(p).exists())
                .unwrap_or_else(|| format!("benches/{file}"))
        });
        let mut child = Command::new("python3")
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("python3 {script}: {e}"))?;
        let input = child.stdin.take().ok_or("no stdin")?;
        let output = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(PyBaseline { child, input, output, script })
    }

    /// Word `nth` of the script's answer to `line`, as a number, or why there is none.
    pub fn ask(&mut self, line: &str, nth: usize) -> Result<f64, String> {
        writeln!(self.input, "{line}").map_err(|e| format!("{}: {e}", self.script))?;
        self.input.flush().map_err(|e| e.to_string())?;
        let mut answer = String::new();
        self.output.read_line(&mut answer).map_err(|e| e.to_string())?;
        if answer.starts_with("error") || answer.is_empty() {
            return Err(if answer.is_empty() { format!("{} printed nothing", self.script) } else { answer.trim().to_string() });
        }
        answer.split_whitespace().nth(nth).and_then(|v| v.parse().ok()).ok_or_else(|| format!("{}: `{}`", self.script, answer.trim()))
    }
}

impl Drop for PyBaseline {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bench row's printed label (`rms fused 16384x8192 bf16`, `  torch cumsum bf16`) as the
/// report's fields: `(source, family, kernel, shape, dtype)`. A leading `torch`, `mamba` or `fla`
/// names a peer; a token of digits and `x` is the shape (`shape` where there is none); a dtype
/// token (`bf16`, `f32`, `bf16->e4m3`) the dtype (`dtype` where there is none); the rest the
/// kernel, whose words pick the family.
#[allow(dead_code)]
pub fn label_fields(label: &str, shape: &str, dtype: &str) -> (String, String, String, String, String) {
    let mut words: Vec<&str> = label.split_whitespace().collect();
    let source = match words.first() {
        Some(&w) if ["torch", "mamba", "fla"].contains(&w) => {
            words.remove(0);
            w
        }
        _ => "tessera",
    };
    let is_dtype = |w: &str| ["bf16", "f16", "f32", "e4m3", "e5m2"].iter().any(|t| w == *t || w.starts_with(&format!("{t}->")));
    let is_shape = |w: &str| w.chars().any(|c| c.is_ascii_digit()) && w.chars().all(|c| c.is_ascii_digit() || c == 'x') && w.contains('x');
    let found_dtype = words.iter().find(|w| is_dtype(w)).map_or(dtype, |w| *w);
    let shapes: Vec<&str> = words.iter().copied().filter(|w| is_shape(w)).collect();
    let kernel: Vec<&str> = words.iter().copied().filter(|w| !is_dtype(w) && !is_shape(w)).collect();
    let kernel = kernel.join(" ");
    let family = [
        ("selective", "selective scan"),
        ("mamba", "selective scan"),
        ("ssd", "ssd"),
        ("linear_attention", "linear attention"),
        ("fla", "linear attention"),
        ("cum", "prefix scan"),
        ("norm", "norm"),
        ("rms", "norm"),
        ("softmax", "softmax"),
        ("rope", "rope"),
        ("quantize", "fp8"),
    ]
    .iter()
    .find(|(word, _)| kernel.contains(word) || label.contains(word))
    .map_or("memory", |(_, f)| f);
    let shape = if shapes.is_empty() { shape.to_string() } else { shapes.join(" ") };
    (source.into(), family.into(), kernel, shape, found_dtype.into())
}

/// Where the report went, or why it did not: printed after the bench's tables.
#[allow(dead_code)]
pub fn write_report(report: &tessera::report::Report) {
    match report.write() {
        Ok(path) => println!(
            "\nresults: {} ({} rows; `cargo run --bin tessera-report -- html {}`)",
            path.display(),
            report.records.len(),
            path.display()
        ),
        Err(e) => println!("\nresults not written: {e}"),
    }
}
