//! The one error type of the runtime.

use cudarc::driver::DriverError;

/// Everything that can go wrong in `tessera`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A kernel argument does not fit the kernel.
    #[error("`{kernel}`: argument `{arg}` expects {expected}, got {found}")]
    Argument {
        /// The kernel (or host function) called.
        kernel: &'static str,
        /// The argument's name.
        arg: String,
        /// What the kernel needs.
        expected: String,
        /// What it was given.
        found: String,
    },
    /// A tensor could not be made as asked.
    #[error("{what}: expected {expected}, got {found}")]
    Tensor {
        /// What was being done.
        what: &'static str,
        /// What is needed.
        expected: String,
        /// What was given.
        found: String,
    },
    /// No CUDA driver library could be loaded on this machine.
    #[error("no CUDA driver: libcuda could not be loaded (is the NVIDIA driver installed?)")]
    NoDriver,
    /// The device ordinal does not exist.
    #[error("CUDA device {ordinal} does not exist: {count} device(s) present")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// None of the kernel's PTX variants runs on this device.
    #[error("`{kernel}` has no PTX variant for compute capability {major}.{minor}: it has {available} (sm_90a needs exactly 9.0, sm_80 needs 8.0 or later)")]
    NoVariant {
        /// The kernel.
        kernel: &'static str,
        /// Device compute capability.
        major: i32,
        /// Device compute capability.
        minor: i32,
        /// The targets it was compiled for.
        available: String,
    },
    /// The target a device was asked to load (`Device::with_target`) is not among the kernel's
    /// variants, or cannot run on the device.
    #[error("`{kernel}` has no {target} PTX that runs here (asked for by `Device::with_target`): it has {available}")]
    TargetUnavailable {
        /// The kernel.
        kernel: &'static str,
        /// The target asked for.
        target: &'static str,
        /// The targets it was compiled for.
        available: String,
    },
    /// The driver rejected a kernel's PTX.
    #[error("loading the {target} PTX of `{kernel}` failed")]
    ModuleLoad {
        /// The kernel.
        kernel: &'static str,
        /// The target.
        target: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// Something only a GPU has was asked of the CPU interpreter.
    #[error("{what} needs a CUDA device, and this one is the CPU interpreter")]
    NotCuda {
        /// What was asked for.
        what: &'static str,
    },
    /// The CPU interpreter stopped a kernel: a deadlock, an access out of bounds, a read of
    /// shared memory nothing wrote, a stage past its ring.
    #[error("`{kernel}`, line {line} (`{text}`): {message}")]
    Kernel {
        /// The kernel.
        kernel: &'static str,
        /// The DSL source line.
        line: u32,
        /// The statement's text.
        text: String,
        /// What went wrong, naming the tensor, ring or barrier.
        message: String,
    },
    /// The schedule cache file could not be used as asked (an import of a file that is not a
    /// Tessera cache, an export to a path that cannot be written).
    #[error("schedule cache {path}: expected {expected}, got {found}")]
    Cache {
        /// The file.
        path: String,
        /// What was needed.
        expected: String,
        /// What was found.
        found: String,
    },
    /// `TESSERA_TUNE` holds something other than `off`, `replay` or `search`.
    #[error("TESSERA_TUNE: expected `off`, `replay` or `search`, got `{0}`")]
    TuneMode(String),
    /// A bench report could not be written, read or merged (`tessera::report`).
    #[error("bench report: {0}")]
    Report(String),
    /// A collective could not complete: the ranks of a group disagree on the call (its kind,
    /// element type or size), or the group was aborted (`tessera::dist`).
    #[error("`{op}` on rank {rank}: {message}")]
    Collective {
        /// The collective (`all_reduce`, `recv`, …).
        op: &'static str,
        /// The rank that reports it.
        rank: usize,
        /// What went wrong, naming the ranks.
        message: String,
    },
    /// A wait outlived its timeout (`tessera::dist`): the communicator was aborted, so that the
    /// other ranks stop too.
    #[error("`{op}`{}: nothing after {waited:?}: {waiting}", rank.map(|r| format!(" on rank {r}")).unwrap_or_default())]
    Timeout {
        /// What waited.
        op: &'static str,
        /// The rank that waited, where there is one.
        rank: Option<usize>,
        /// How long it waited.
        waited: std::time::Duration,
        /// What it waited for.
        waiting: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] DriverError),
    /// A CUDA library other than the driver (cuFFT, NCCL) could not be loaded, or a call into
    /// it failed: `library` names it.
    #[error("{library}: {message}")]
    Library {
        /// The library (`libcufft`).
        library: &'static str,
        /// What failed.
        message: String,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
