//! The `flashcore` command: info, check, bench, attn, compile.

mod attn;
mod bench;
mod cases;
mod check;
mod compile;
mod errors;
mod info;
mod io;
mod suites;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// FlashCore: fused attention kernels for NVIDIA GPUs, JIT-compiled and cached.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// GPU, NVRTC, cache and kernels (works without a GPU).
    Info,
    /// Correctness suite of every kernel on this GPU against the f64 reference.
    Check(check::CheckArgs),
    /// Timed benchmark suite: table and JSON.
    Bench(bench::BenchArgs),
    /// Attention on q, k, v from a safetensors file.
    Attn(attn::AttnArgs),
    /// Compile every kernel variant ahead of time and report resources (no GPU needed).
    Compile(compile::CompileArgs),
}

fn main() -> ExitCode {
    // Die quietly of SIGPIPE, as command-line tools do (`flashcore info | head`), instead of
    // Rust's default of ignoring it and panicking on the failed write.
    #[cfg(unix)]
    // SAFETY: restores the default disposition of one signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Info => info::run(),
        Command::Check(a) => check::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Attn(a) => attn::run(a),
        Command::Compile(a) => compile::run(a),
    };
    // What the command does without a GPU, named when it found none.
    let no_gpu_hint = match &cli.command {
        Command::Attn(_) => Some("run with --cpu for the CPU reference"),
        _ => None,
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("flashcore: {}", errors::message(&e, no_gpu_hint));
            ExitCode::FAILURE
        }
    }
}
