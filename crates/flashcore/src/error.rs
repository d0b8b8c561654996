//! The one error type of the crate. Every variant names what went wrong and, for bad input,
//! which argument.

use std::path::PathBuf;

/// Everything that can go wrong in FlashCore.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor's shape does not fit the problem (`arg` is `"q"`, `"k"`, `"v"`, `"o"` or `"lse"`).
    #[error("shape of `{arg}`: {msg}")]
    Shape {
        /// The offending argument.
        arg: &'static str,
        /// What is wrong, with the shapes involved.
        msg: String,
    },
    /// A tensor's dtype is not supported, or the tensors' dtypes differ.
    #[error("dtype of `{arg}`: {msg}")]
    DType {
        /// The offending argument.
        arg: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// A stride is not supported (the last dim must be contiguous, others multiples of 8).
    #[error("strides of `{arg}`: {msg}")]
    Stride {
        /// The offending argument.
        arg: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// A device pointer is not 16-byte aligned.
    #[error("alignment of `{arg}`: device pointer {ptr:#x} is not 16-byte aligned")]
    Alignment {
        /// The offending argument.
        arg: &'static str,
        /// The pointer.
        ptr: u64,
    },
    /// The head dimension is not one the kernels support.
    #[error("head dim {head_dim} is not supported (supported: {supported})")]
    HeadDim {
        /// The requested head dim.
        head_dim: usize,
        /// The supported ones, as a list.
        supported: String,
    },
    /// A tensor lives on another device than the context.
    #[error("device of `{arg}`: tensor is on device {tensor_device}, the context on device {context_device}")]
    DeviceMismatch {
        /// The offending argument.
        arg: &'static str,
        /// The tensor's device ordinal.
        tensor_device: usize,
        /// The context's device ordinal.
        context_device: usize,
    },
    /// An attention parameter is invalid (a non-finite scale, say).
    #[error("parameter `{arg}`: {msg}")]
    Param {
        /// The offending parameter.
        arg: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// No CUDA driver or no GPU.
    #[error("no usable GPU: {0}")]
    NoGpu(String),
    /// `libnvrtc` could not be found or loaded.
    #[error("NVRTC not found: {0}")]
    NvrtcNotFound(String),
    /// NVRTC rejected a kernel; `log` is the compiler's log.
    #[error("compiling kernel `{kernel}` for {arch} failed (options: {options}):\n{log}")]
    Compile {
        /// The kernel variant.
        kernel: String,
        /// The target arch, e.g. `sm_90a`.
        arch: String,
        /// The NVRTC options used.
        options: String,
        /// The NVRTC log.
        log: String,
    },
    /// The requested kernel cannot run this problem on this device.
    #[error("kernel `{kernel}` cannot run this problem: {msg}")]
    Unsupported {
        /// The kernel family.
        kernel: String,
        /// Why not.
        msg: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call failed while {context}: {source}")]
    Driver {
        /// What FlashCore was doing.
        context: String,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// A cache directory or file that FlashCore would load code from is not the current
    /// user's alone (`jit::trust`): another user could plant kernels or a library there.
    #[error(
        "refusing the cache {path}: {why}. FlashCore loads code from its cache and trusts only what the current user \
         (uid {uid}) owns and no other user can write: `chmod go-w` it, or set FLASHCORE_CACHE_DIR to a private directory"
    )]
    UntrustedCache {
        /// The directory or file refused.
        path: PathBuf,
        /// Its owner and mode, as found.
        why: String,
        /// The current user.
        uid: u32,
    },
    /// A file-system operation (the kernel cache) failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds the "while …" context to a driver result.
pub(crate) trait DriverContext<T> {
    fn ctx(self, context: impl Into<String>) -> Result<T>;
    /// As `ctx`, the context made only on failure: for the launch path, which would otherwise
    /// format a string on every call.
    fn ctx_with(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> DriverContext<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn ctx(self, context: impl Into<String>) -> Result<T> {
        self.map_err(|source| Error::Driver { context: context.into(), source })
    }

    fn ctx_with(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Driver { context: context(), source })
    }
}
