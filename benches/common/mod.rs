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
