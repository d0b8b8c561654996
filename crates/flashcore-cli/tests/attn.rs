//! `flashcore attn` end to end: the built binary on small safetensors files, in each of the
//! input's forms (dense, packed, KV cache), on the CPU reference unless a test says otherwise.

use std::process::Command;

use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// A tensor of the input file: f32 values (fixed, in [-1, 1)) of a shape, or int32 values.
enum Tensor {
    F32(Vec<usize>),
    I32(Vec<i32>),
}

fn f32(shape: &[usize]) -> Tensor {
    Tensor::F32(shape.to_vec())
}

fn i32(values: &[i32]) -> Tensor {
    Tensor::I32(values.to_vec())
}

/// A dense batch: q [1, 4, 2, 8], k, v [1, 5, 2, 8].
fn dense() -> Vec<(&'static str, Tensor)> {
    vec![("q", f32(&[1, 4, 2, 8])), ("k", f32(&[1, 5, 2, 8])), ("v", f32(&[1, 5, 2, 8]))]
}

/// A packed batch of two sequences: q [5, 2, 8], k, v [7, 2, 8].
fn packed() -> Vec<(&'static str, Tensor)> {
    vec![
        ("q", f32(&[5, 2, 8])),
        ("k", f32(&[7, 2, 8])),
        ("v", f32(&[7, 2, 8])),
        ("cu_seqlens_q", i32(&[0, 2, 5])),
        ("cu_seqlens_k", i32(&[0, 3, 7])),
    ]
}

/// A contiguous KV cache of two sequences: q [2, 1, 2, 8], k_cache, v_cache [2, 16, 2, 8].
fn cache() -> Vec<(&'static str, Tensor)> {
    vec![("q", f32(&[2, 1, 2, 8])), ("k_cache", f32(&[2, 16, 2, 8])), ("v_cache", f32(&[2, 16, 2, 8])), ("cache_seqlens", i32(&[9, 16]))]
}

/// `tensors` with `changes`: each replaces the tensor of its name, or joins them.
fn with(mut tensors: Vec<(&'static str, Tensor)>, changes: Vec<(&'static str, Tensor)>) -> Vec<(&'static str, Tensor)> {
    for (name, tensor) in changes {
        match tensors.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = tensor,
            None => tensors.push((name, tensor)),
        }
    }
    tensors
}

/// What a run of the binary printed, and whether it succeeded.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// An input file of `tensors` in a temporary directory, and an output path beside it.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new(tensors: &[(&str, Tensor)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = tensors
            .iter()
            .map(|(name, t)| match t {
                Tensor::F32(shape) => {
                    let n: usize = shape.iter().product();
                    let values = (0..n).map(|i| ((i * 7 % 16) as f32 - 8.0) / 8.0);
                    (*name, Dtype::F32, shape.clone(), values.flat_map(f32::to_le_bytes).collect())
                }
                Tensor::I32(values) => (*name, Dtype::I32, vec![values.len()], values.iter().flat_map(|x| x.to_le_bytes()).collect()),
            })
            .collect();
        let views: Vec<_> =
            bytes.iter().map(|(name, dtype, shape, b)| (*name, TensorView::new(*dtype, shape.clone(), b).unwrap())).collect();
        std::fs::write(dir.path().join("in.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
        Self { dir }
    }

    fn input(&self) -> String {
        self.dir.path().join("in.safetensors").to_str().unwrap().into()
    }

    fn output(&self) -> String {
        self.dir.path().join("out.safetensors").to_str().unwrap().into()
    }
}

/// `flashcore attn --input FILE --output OUT ARGS...` with `tensors` in FILE.
fn attn(tensors: &[(&str, Tensor)], args: &[&str]) -> Run {
    let files = Files::new(tensors);
    run(&[&["attn", "--input", &files.input(), "--output", &files.output()], args].concat())
}

fn run(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_flashcore")).args(args).output().expect("the binary runs");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

#[test]
fn every_form_runs_on_the_cpu() {
    for form in [dense(), packed(), cache()] {
        for args in [&["--cpu"][..], &["--cpu", "--causal", "--attention-chunk", "3"]] {
            let r = attn(&form, args);
            assert!(r.ok && r.stdout.starts_with("wrote o, lse"), "{args:?}: {}{}", r.stdout, r.stderr);
        }
    }
}

/// A call without (query, key) pairs is answered as the library answers it (its one rule):
/// no rows, an empty `o` and `lse`; no keys, `o` zero and `lse` -inf.
#[test]
fn calls_without_pairs_answer_as_the_library_does() {
    let no_keys = with(dense(), vec![("k", f32(&[1, 0, 2, 8])), ("v", f32(&[1, 0, 2, 8]))]);
    for (tensors, o_shape, lse_shape) in
        [(with(dense(), vec![("q", f32(&[1, 0, 2, 8]))]), vec![1, 0, 2, 8], vec![1, 2, 0]), (no_keys, vec![1, 4, 2, 8], vec![1, 2, 4])]
    {
        let files = Files::new(&tensors);
        let r = run(&["attn", "--input", &files.input(), "--output", &files.output(), "--cpu", "--f64-out"]);
        assert!(r.ok, "{}{}", r.stdout, r.stderr);
        let bytes = std::fs::read(files.output()).unwrap();
        let out = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let values = |name: &str| -> (Vec<usize>, Vec<f64>) {
            let t = out.tensor(name).unwrap();
            (t.shape().to_vec(), t.data().chunks(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect())
        };
        let ((o_got, o), (lse_got, lse)) = (values("o"), values("lse"));
        assert_eq!((o_got, lse_got), (o_shape, lse_shape));
        assert!(o.iter().all(|&x| x == 0.0) && lse.iter().all(|&x| x == f64::NEG_INFINITY), "o {o:?}, lse {lse:?}");
    }
}

#[test]
fn a_file_error_names_its_cause_once() {
    let r = run(&["attn", "--cpu", "--input", "/nonexistent/in.safetensors", "--output", "/nonexistent/out.safetensors"]);
    assert!(!r.ok);
    assert_eq!(r.stderr.matches("(os error 2)").count(), 1, "{}", r.stderr);
    let files = Files::new(&dense());
    let r = run(&["attn", "--cpu", "--input", &files.input(), "--output", "/nonexistent/out.safetensors"]);
    assert!(!r.ok && r.stderr.contains("cannot write `/nonexistent/out.safetensors`"), "{}", r.stderr);
    assert_eq!(r.stderr.matches("(os error 2)").count(), 1, "{}", r.stderr);
}

/// Asserted where the machine has no GPU (the run then fails for want of one).
#[test]
fn without_a_gpu_the_error_names_the_cpu_reference() {
    let r = attn(&dense(), &["--dtype", "bf16"]);
    if r.stderr.contains("no usable GPU") {
        assert!(r.stderr.trim_end().ends_with("(run with --cpu for the CPU reference)"), "{}", r.stderr);
    }
}

/// With no GPU to be seen (`CUDA_VISIBLE_DEVICES=`, so on any machine), f32 inputs without
/// `--dtype` are refused for the missing GPU, not for their dtype: that is what to fix first.
#[test]
fn without_a_gpu_the_missing_gpu_is_said_before_the_dtype() {
    let files = Files::new(&dense());
    let args = ["attn", "--input", &files.input(), "--output", &files.output()];
    let out = Command::new(env!("CARGO_BIN_EXE_flashcore")).args(args).env("CUDA_VISIBLE_DEVICES", "").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.starts_with("flashcore: no usable GPU: "), "{stderr}");
    assert!(!stderr.contains("bf16") && stderr.lines().count() == 1, "{stderr}");
}

#[test]
fn cpu_with_a_gpu_dtype_is_refused_naming_both_flags() {
    let r = attn(&dense(), &["--cpu", "--dtype", "bf16"]);
    assert!(!r.ok && r.stderr.starts_with("flashcore: --dtype bf16 rounds the GPU's inputs, but --cpu"), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
}

#[test]
fn an_output_over_the_input_is_refused_and_the_input_kept() {
    let files = Files::new(&dense());
    let before = std::fs::read(files.input()).unwrap();
    let same = files.dir.path().join(".").join("in.safetensors");
    let r = run(&["attn", "--cpu", "--input", &files.input(), "--output", same.to_str().unwrap()]);
    assert!(!r.ok && r.stderr.contains("is the --input file"), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert_eq!(std::fs::read(files.input()).unwrap(), before);
}

#[test]
fn the_cpu_refuses_the_parameters_the_gpu_refuses() {
    let refused = [
        ("--scale=nan", "--scale: NaN must be finite"),
        ("--scale=inf", "--scale: inf must be finite"),
        ("--scale=-1", "--scale: -1 must be finite"),
        ("--softcap=-1", "--softcap: -1 must be 0 (off)"),
        ("--window=-2,0", "--window: (-2, 0): each side"),
        ("--attention-chunk=4294967296", "--attention-chunk: 4294967296 must be at most 2147483647"),
    ];
    for form in [dense(), packed(), cache()] {
        for (arg, want) in refused {
            let r = attn(&form, &["--cpu", arg]);
            assert!(!r.ok && r.stderr.contains(want), "{arg}: {}", r.stderr);
            assert_eq!(r.stderr.lines().count(), 1, "{arg}: one line, got {}", r.stderr);
            assert!(r.stdout.is_empty(), "{arg}: nothing written, got {}", r.stdout);
        }
    }
}

/// As `--window` and `--softcap` do, `--scale` takes a value that starts with `-`, so that
/// the library's check, not clap's parser, says what is wrong with it.
#[test]
fn a_negative_scale_reaches_the_check() {
    for scale in ["-1", "-inf"] {
        let r = attn(&dense(), &["--cpu", "--scale", scale]);
        let want = format!("flashcore: --scale: {scale} must be finite and >= 0");
        assert!(!r.ok && r.stderr.contains(&want), "{}", r.stderr);
    }
}

/// The shapes the GPU path refuses, refused with `--cpu` in the library's words: the tensor,
/// the dimension and both values.
#[test]
fn the_cpu_refuses_the_shapes_the_gpu_refuses() {
    let refused = [
        (with(dense(), vec![("v", f32(&[1, 6, 2, 8]))]), "shape of `v`: [1, 6, 2, 8] differs from k's [1, 5, 2, 8]"),
        (with(dense(), vec![("q", f32(&[1, 4, 3, 8]))]), "shape of `k`: q heads (3) are not a multiple of k/v heads (2)"),
        (with(dense(), vec![("q", f32(&[2, 4, 2, 8]))]), "shape of `k`: batch 1 differs from q's batch 2"),
        (
            with(dense(), vec![("k", f32(&[1, 5, 2, 16])), ("v", f32(&[1, 5, 2, 16]))]),
            "shape of `k`: head dim 16 differs from q's head dim 8",
        ),
        (with(dense(), vec![("q", f32(&[1, 4, 0, 8]))]), "shape of `q`: [1, 4, 0, 8] has no heads or no head dim"),
        (with(dense(), vec![("k", f32(&[1, 5, 2, 16]))]), "shape of `k`: head dim 16 differs from q's head dim 8"),
        (with(packed(), vec![("k", f32(&[7, 2, 16])), ("v", f32(&[7, 2, 16]))]), "shape of `k`: head dim 16 differs from q's head dim 8"),
        (
            with(packed(), vec![("q", f32(&[2, 5, 2, 8]))]),
            "shape of `q`: a packed batch is [1, total, H, D] (or [total, H, D]); got batch 2",
        ),
        (with(cache(), vec![("v_cache", f32(&[2, 16, 1, 8]))]), "shape of `v_cache`: [2, 16, 1, 8] differs from k_cache's [2, 16, 2, 8]"),
        (with(cache(), vec![("q", f32(&[3, 1, 2, 8]))]), "shape of `k_cache`: batch 2 differs from q's batch 3"),
        (with(cache(), vec![("q", f32(&[2, 1, 3, 8]))]), "shape of `k_cache`: q heads (3) are not a multiple of k/v heads (2)"),
        (
            with(cache(), vec![("k_new", f32(&[2, 1, 1, 8])), ("v_new", f32(&[2, 1, 1, 8]))]),
            "shape of `k_new`: heads 1 differs from k_cache's heads 2",
        ),
        (with(cache(), vec![("cache_seqlens", i32(&[9]))]), "shape of `cache_seqlens`: 1 entries, need B = 2"),
    ];
    for (tensors, want) in refused {
        let r = attn(&tensors, &["--cpu"]);
        assert!(!r.ok && r.stderr.contains(want), "want {want:?}, got {}", r.stderr);
    }
}

/// V's own head dim (`ProblemShape::head_dim_v`): a dense call runs it in the f64 reference,
/// `o` and the gradient `do` shaped `[B, Sq, Hq, Dv]`, `dv` like `v`; a packed batch and a KV
/// cache refuse it naming `v` (`v_cache`).
#[test]
fn a_v_head_dim_of_its_own_runs_on_the_cpu() {
    let tensors = with(dense(), vec![("v", f32(&[1, 5, 2, 16])), ("do", f32(&[1, 4, 2, 16]))]);
    let files = Files::new(&tensors);
    let r = run(&["attn", "--input", &files.input(), "--output", &files.output(), "--cpu", "--causal"]);
    assert!(r.ok && r.stdout.starts_with("wrote o, lse, dq, dk, dv"), "{}{}", r.stdout, r.stderr);
    let bytes = std::fs::read(files.output()).unwrap();
    let out = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let shape = |name: &str| out.tensor(name).unwrap().shape().to_vec();
    assert_eq!(
        (shape("o"), shape("dq"), shape("dk"), shape("dv")),
        (vec![1, 4, 2, 16], vec![1, 4, 2, 8], vec![1, 5, 2, 8], vec![1, 5, 2, 16])
    );
    let r = attn(&with(dense(), vec![("v", f32(&[1, 5, 2, 16])), ("do", f32(&[1, 4, 2, 8]))]), &["--cpu"]);
    assert!(!r.ok && r.stderr.contains("`do`"), "do is shaped like the output: {}", r.stderr);
    let r = attn(&with(packed(), vec![("v", f32(&[7, 2, 16]))]), &["--cpu"]);
    assert!(!r.ok && r.stderr.contains("shape of `v`"), "{}", r.stderr);
    let r = attn(&with(cache(), vec![("v_cache", f32(&[2, 16, 2, 16]))]), &["--cpu"]);
    assert!(!r.ok && r.stderr.contains("shape of `v_cache`"), "{}", r.stderr);
}
