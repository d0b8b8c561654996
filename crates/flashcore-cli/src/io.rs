//! Safetensors I/O for `flashcore attn`: read `q`, `k`, `v`; write `o` and `lse`.
//!
//! Values are widened to f64 on read and rounded to nearest in the file dtype on write, so
//! the CPU reference and the GPU path see exactly what the file holds.

use flashcore::DType;
use half::{bf16, f16};
use safetensors::{tensor::TensorView, Dtype, SafeTensorError, SafeTensors};
use std::path::{Path, PathBuf};

/// The element types `attn` reads and writes. `F64` is only written (`o` and `lse` when
/// full precision is asked for); inputs are F16, BF16, F32 or F8_E4M3 (whose outputs are
/// BF16: [`FileDType::output`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileDType {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// FP8 e4m3 (`float8_e4m3fn`; input only).
    E4M3,
    /// IEEE single precision.
    F32,
    /// IEEE double precision (output only).
    F64,
}

impl FileDType {
    /// The dtype outputs computed from inputs of this one are written in: e4m3's bf16 (as the
    /// GPU gives them), the others their own.
    pub fn output(self) -> FileDType {
        if self == FileDType::E4M3 {
            FileDType::BF16
        } else {
            self
        }
    }
}

/// A host tensor read from / written to safetensors: shape, dtype and values widened to f64.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions, outermost first (row-major, contiguous).
    pub shape: Vec<usize>,
    /// The dtype in the file.
    pub dtype: FileDType,
    /// The values, `shape.iter().product()` of them.
    pub data: Vec<f64>,
}

/// What went wrong reading or writing a safetensors file, and with which tensor.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The file could not be read.
    #[error("cannot read `{}`: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file could not be written.
    #[error("cannot write `{}`: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The bytes are not a valid safetensors file (or could not be encoded as one).
    #[error("`{}` is not a valid safetensors file: {source}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        source: SafeTensorError,
    },
    /// A required tensor is absent.
    #[error("`{}` has no tensor named `{name}` (it has: {found})", path.display())]
    MissingTensor {
        /// The file.
        path: PathBuf,
        /// The tensor looked for.
        name: &'static str,
        /// The names it does have, comma-separated.
        found: String,
    },
    /// A tensor has a dtype `attn` does not take, or differs from `q`'s.
    #[error("tensor `{name}` in `{}` is {dtype}; expected {expected}", path.display())]
    WrongDType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: &'static str,
        /// Its dtype in the file.
        dtype: String,
        /// What was expected.
        expected: String,
    },
    /// A tensor is not rank 4.
    #[error("tensor `{name}` in `{}` has shape {shape:?}; expected rank 4 [B, S, H, D]", path.display())]
    WrongRank {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: &'static str,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A tensor's shape differs from the one it must have (`do` from `q`'s).
    #[error("tensor `{name}` in `{}` has shape {shape:?}; expected {expected:?}", path.display())]
    WrongShape {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: &'static str,
        /// Its shape.
        shape: Vec<usize>,
        /// The shape it must have.
        expected: Vec<usize>,
    },
    /// A tensor to write has a number of values that does not fill its shape.
    #[error("tensor `{name}` has {len} values, its shape {shape:?} needs {}", shape.iter().product::<usize>())]
    Length {
        /// The tensor.
        name: &'static str,
        /// Its number of values.
        len: usize,
        /// Its shape.
        shape: Vec<usize>,
    },
}

/// Reads the tensors `q`, `k`, `v` of `path`: F16, BF16 or F32, all of `q`'s dtype, rank 4
/// (BSHD), or rank 3 `[total, H, D]` beside `cu_seqlens_q` (a packed batch, read as
/// `[1, total, H, D]`). Shapes are not checked against each other here; the attention API does that.
pub fn read_qkv(path: &Path) -> Result<(HostTensor, HostTensor, HostTensor), IoError> {
    let bytes = std::fs::read(path).map_err(|source| IoError::Read { path: path.into(), source })?;
    let file = SafeTensors::deserialize(&bytes).map_err(|source| IoError::Format { path: path.into(), source })?;
    let packed = file.names().contains(&"cu_seqlens_q");
    let q = read_input(&file, path, "q", packed, None)?;
    let (k, v) = (read_input(&file, path, "k", packed, Some(&q))?, read_input(&file, path, "v", packed, Some(&q))?);
    Ok((q, k, v))
}

/// An input tensor `name`: F16, BF16 or F32 (`like`'s dtype when given), rank 4, or rank 3
/// `[total, H, D]` of a `packed` batch (read as `[1, total, H, D]`).
fn read_input(file: &SafeTensors, path: &Path, name: &'static str, packed: bool, like: Option<&HostTensor>) -> Result<HostTensor, IoError> {
    let mut t = read_tensor(file, path, name)?;
    if t.dtype == FileDType::F64 {
        let (dtype, expected) = ("F64".into(), "F16, BF16 or F32".into());
        return Err(IoError::WrongDType { path: path.into(), name, dtype, expected });
    }
    if let Some(q) = like.filter(|q| q.dtype != t.dtype) {
        let (dtype, expected) = (format!("{:?}", t.dtype), format!("{:?} like `q`", q.dtype));
        return Err(IoError::WrongDType { path: path.into(), name, dtype, expected });
    }
    if t.shape.len() == 3 && packed {
        t.shape.insert(0, 1); // a packed batch [total, H, D] is one batch entry
    }
    if t.shape.len() != 4 {
        return Err(IoError::WrongRank { path: path.into(), name, shape: t.shape });
    }
    Ok(t)
}

/// A KV cache from an input file (`attn`'s KV-cache format; `flashcore::PagedKv`): `q [B,
/// Sq, Hq, D]`, the caches `k_cache`, `v_cache` (pools `[num_pages, page_size, Hkv, D]` with
/// `block_table`, else contiguous `[B, S_cache, Hkv, D]`), each sequence's cached length and
/// the keys to append. Shapes are not checked against each other here.
pub struct HostKvCache {
    pub q: HostTensor,
    pub k_cache: HostTensor,
    pub v_cache: HostTensor,
    /// `[B, S_new, Hkv, D]`, appended at `cache_seqlens[b]..` before attention.
    pub k_new: Option<HostTensor>,
    pub v_new: Option<HostTensor>,
    /// `[B, max_pages]` row-major, and its shape.
    pub block_table: Option<(Vec<i32>, [usize; 2])>,
    /// `[B]`.
    pub cache_seqlens: Option<Vec<i32>>,
}

/// Reads `path` as a KV cache (`None` when it has no `k_cache`): `q`, `k_cache`, `v_cache` and
/// the optional `k_new`, `v_new` (float, all of `q`'s dtype, rank 4), `block_table` (I32, rank
/// 2) and `cache_seqlens` (I32, rank 1).
pub fn read_kvcache(path: &Path) -> Result<Option<HostKvCache>, IoError> {
    let bytes = std::fs::read(path).map_err(|source| IoError::Read { path: path.into(), source })?;
    let file = SafeTensors::deserialize(&bytes).map_err(|source| IoError::Format { path: path.into(), source })?;
    let names = file.names();
    if !names.contains(&"k_cache") {
        return Ok(None);
    }
    let q = read_input(&file, path, "q", false, None)?;
    let tensor = |name| read_input(&file, path, name, false, Some(&q));
    let optional = |name: &'static str| names.contains(&name).then(|| tensor(name)).transpose();
    let block_table = match names.contains(&"block_table") {
        true => Some(read_i32(&file, path, "block_table", 2)?).map(|(data, shape)| (data, [shape[0], shape[1]])),
        false => None,
    };
    let cache_seqlens =
        names.contains(&"cache_seqlens").then(|| read_i32(&file, path, "cache_seqlens", 1)).transpose()?.map(|(data, _)| data);
    Ok(Some(HostKvCache {
        k_cache: tensor("k_cache")?,
        v_cache: tensor("v_cache")?,
        k_new: optional("k_new")?,
        v_new: optional("v_new")?,
        q,
        block_table,
        cache_seqlens,
    }))
}

/// The I32 tensor `name` of rank `rank`: its values (row-major) and shape.
fn read_i32(file: &SafeTensors, path: &Path, name: &'static str, rank: usize) -> Result<(Vec<i32>, Vec<usize>), IoError> {
    let view = file.tensor(name).map_err(|_| IoError::MissingTensor { path: path.into(), name, found: file.names().join(", ") })?;
    if view.dtype() != Dtype::I32 {
        return Err(IoError::WrongDType { path: path.into(), name, dtype: view.dtype().to_string(), expected: "I32".into() });
    }
    if view.shape().len() != rank {
        let expected = match rank {
            1 => vec![view.shape().iter().product()],
            _ => vec![view.shape().first().copied().unwrap_or(1), view.shape().iter().skip(1).product()],
        };
        return Err(IoError::WrongShape { path: path.into(), name, shape: view.shape().to_vec(), expected });
    }
    let values = view.data().chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    Ok((values, view.shape().to_vec()))
}

/// Reads the optional tensor `do` (the output's gradient) of `path`: `None` when the file has
/// none; else it must be shaped like the output, `q`'s shape with V's head dim `head_dim_v`,
/// and have `q`'s dtype.
pub fn read_dout(path: &Path, q: &HostTensor, head_dim_v: usize) -> Result<Option<HostTensor>, IoError> {
    let bytes = std::fs::read(path).map_err(|source| IoError::Read { path: path.into(), source })?;
    let file = SafeTensors::deserialize(&bytes).map_err(|source| IoError::Format { path: path.into(), source })?;
    if !file.names().contains(&"do") {
        return Ok(None);
    }
    let mut dout = read_tensor(&file, path, "do")?;
    if dout.shape.len() == 3 && q.shape.len() == 4 && q.shape[0] == 1 {
        dout.shape.insert(0, 1); // packed, [total_q, Hq, D] as `q` was read
    }
    if dout.dtype != q.dtype {
        let (dtype, expected) = (format!("{:?}", dout.dtype), format!("{:?} like `q`", q.dtype));
        return Err(IoError::WrongDType { path: path.into(), name: "do", dtype, expected });
    }
    let mut expected = q.shape.clone();
    if let Some(last) = expected.last_mut() {
        *last = head_dim_v;
    }
    if dout.shape != expected {
        return Err(IoError::WrongShape { path: path.into(), name: "do", shape: dout.shape, expected });
    }
    Ok(Some(dout))
}

/// A packed batch's vectors from an input file (`attn`'s varlen format): int32, rank 1.
pub struct HostSeqlens {
    pub cu_seqlens_q: Vec<i32>,
    pub cu_seqlens_k: Vec<i32>,
    pub seqused_k: Option<Vec<i32>>,
}

/// Reads `cu_seqlens_q` and `cu_seqlens_k` (and `seqused_k` if present) of `path`, I32 and
/// rank 1: `None` when the file has no `cu_seqlens_q` (a dense problem).
pub fn read_seqlens(path: &Path) -> Result<Option<HostSeqlens>, IoError> {
    let bytes = std::fs::read(path).map_err(|source| IoError::Read { path: path.into(), source })?;
    let file = SafeTensors::deserialize(&bytes).map_err(|source| IoError::Format { path: path.into(), source })?;
    if !file.names().contains(&"cu_seqlens_q") {
        return Ok(None);
    }
    let read = |name: &'static str| read_i32(&file, path, name, 1).map(|(values, _)| values);
    let seqused_k = if file.names().contains(&"seqused_k") { Some(read("seqused_k")?) } else { None };
    Ok(Some(HostSeqlens { cu_seqlens_q: read("cu_seqlens_q")?, cu_seqlens_k: read("cu_seqlens_k")?, seqused_k }))
}

/// Writes the named tensors to `path`, each in its own dtype.
pub fn write_tensors(path: &Path, tensors: &[(&'static str, &HostTensor)]) -> Result<(), IoError> {
    let mut encoded = Vec::with_capacity(tensors.len());
    for &(name, t) in tensors {
        if t.data.len() != t.shape.iter().product::<usize>() {
            return Err(IoError::Length { name, len: t.data.len(), shape: t.shape.clone() });
        }
        encoded.push((name, t, encode(t.dtype, &t.data)));
    }
    let format = |source| IoError::Format { path: path.into(), source };
    let views = encoded
        .iter()
        .map(|(name, t, bytes)| Ok((*name, TensorView::new(dtype_in_file(t.dtype), t.shape.clone(), bytes)?)))
        .collect::<Result<Vec<_>, SafeTensorError>>()
        .map_err(format)?;
    let bytes = safetensors::serialize(views, None).map_err(format)?;
    std::fs::write(path, bytes).map_err(|source| IoError::Write { path: path.into(), source })
}

fn read_tensor(file: &SafeTensors, path: &Path, name: &'static str) -> Result<HostTensor, IoError> {
    let view = file.tensor(name).map_err(|_| {
        let mut names = file.names();
        names.sort_unstable();
        IoError::MissingTensor { path: path.into(), name, found: names.join(", ") }
    })?;
    let dtype = match view.dtype() {
        Dtype::F16 => FileDType::F16,
        Dtype::BF16 => FileDType::BF16,
        Dtype::F32 => FileDType::F32,
        Dtype::F64 => FileDType::F64,
        Dtype::F8_E4M3 => FileDType::E4M3,
        other => {
            let (dtype, expected) = (other.to_string(), "F16, BF16, F32 or F8_E4M3".into());
            return Err(IoError::WrongDType { path: path.into(), name, dtype, expected });
        }
    };
    Ok(HostTensor { shape: view.shape().to_vec(), dtype, data: decode(dtype, view.data()) })
}

fn dtype_in_file(dtype: FileDType) -> Dtype {
    match dtype {
        FileDType::F16 => Dtype::F16,
        FileDType::BF16 => Dtype::BF16,
        FileDType::F32 => Dtype::F32,
        FileDType::F64 => Dtype::F64,
        FileDType::E4M3 => Dtype::F8_E4M3,
    }
}

/// Little-endian bytes to f64 (safetensors is little-endian; its parser checked the length).
fn decode(dtype: FileDType, bytes: &[u8]) -> Vec<f64> {
    match dtype {
        FileDType::F16 => bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        FileDType::BF16 => bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        FileDType::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64).collect(),
        FileDType::F64 => bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect(),
        FileDType::E4M3 => bytes.iter().map(|&b| DType::E4M3.decode(u16::from(b)) as f64).collect(),
    }
}

/// f64 to little-endian bytes of `dtype`, rounding to nearest.
fn encode(dtype: FileDType, data: &[f64]) -> Vec<u8> {
    match dtype {
        FileDType::F16 => data.iter().flat_map(|&x| f16::from_f64(x).to_le_bytes()).collect(),
        FileDType::BF16 => data.iter().flat_map(|&x| bf16::from_f64(x).to_le_bytes()).collect(),
        FileDType::F32 => data.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
        FileDType::F64 => data.iter().flat_map(|&x| x.to_le_bytes()).collect(),
        FileDType::E4M3 => data.iter().map(|&x| DType::E4M3.encode(x as f32) as u8).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(shape: &[usize], dtype: FileDType, seed: usize) -> HostTensor {
        let n = shape.iter().product::<usize>();
        // Multiples of 1/8 in [-4, 4) (of 1/2 for e4m3, whose 3 mantissa bits hold 3.5 but not
        // 3.875): exact in the dtype, so round trips are exact.
        let step = if dtype == FileDType::E4M3 { 2.0 } else { 8.0 };
        let data = (0..n).map(|i| ((i * 7 + seed * 13) % (8 * step as usize)) as f64 / step - 4.0).collect();
        HostTensor { shape: shape.to_vec(), dtype, data }
    }

    fn qkv(dtype: FileDType) -> [HostTensor; 3] {
        [tensor(&[2, 3, 4, 8], dtype, 1), tensor(&[2, 5, 2, 8], dtype, 2), tensor(&[2, 5, 2, 8], dtype, 3)]
    }

    #[test]
    fn qkv_round_trip_in_every_input_dtype() {
        for dtype in [FileDType::F16, FileDType::BF16, FileDType::F32, FileDType::E4M3] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("qkv.safetensors");
            let [q, k, v] = qkv(dtype);
            write_tensors(&path, &[("q", &q), ("k", &k), ("v", &v)]).unwrap();
            assert_eq!(read_qkv(&path).unwrap(), (q, k, v), "{dtype:?}");
        }
    }

    #[test]
    fn outputs_round_trip_including_f64_and_infinities() {
        for dtype in [FileDType::F16, FileDType::BF16, FileDType::F32, FileDType::F64] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("out.safetensors");
            let o = tensor(&[1, 3, 2, 4], dtype, 5);
            let lse = HostTensor { shape: vec![1, 2, 3], dtype: FileDType::F32, data: vec![f64::NEG_INFINITY, 0.5, 1.0, -2.0, 3.25, 0.0] };
            write_tensors(&path, &[("o", &o), ("lse", &lse)]).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let file = SafeTensors::deserialize(&bytes).unwrap();
            assert_eq!(read_tensor(&file, &path, "o").unwrap(), o, "{dtype:?}");
            assert_eq!(read_tensor(&file, &path, "lse").unwrap(), lse);
        }
    }

    #[test]
    fn writing_rounds_to_the_nearest_value_of_the_dtype() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.safetensors");
        let data = vec![0.1, -1.0 / 3.0, 1e-6, 65504.0];
        for (dtype, round) in [
            (FileDType::F16, (|x| f16::from_f64(x).to_f64()) as fn(f64) -> f64),
            (FileDType::BF16, |x| bf16::from_f64(x).to_f64()),
            (FileDType::F32, |x| x as f32 as f64),
        ] {
            let o = HostTensor { shape: vec![1, 1, 1, 4], dtype, data: data.clone() };
            let lse = HostTensor { shape: vec![1, 1, 1], dtype: FileDType::F32, data: vec![0.0] };
            write_tensors(&path, &[("o", &o), ("lse", &lse)]).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let read = read_tensor(&SafeTensors::deserialize(&bytes).unwrap(), &path, "o").unwrap();
            assert_eq!(read.data, data.iter().map(|&x| round(x)).collect::<Vec<_>>());
            assert_ne!(read.data, data, "{dtype:?} should not hold these exactly");
        }
    }

    #[test]
    fn missing_tensor_is_named_with_the_ones_present() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qk.safetensors");
        let [q, k, _] = qkv(FileDType::F16);
        write_tensors(&path, &[("q", &q), ("k", &k)]).unwrap();
        let err = read_qkv(&path).unwrap_err();
        assert!(matches!(err, IoError::MissingTensor { name: "v", .. }), "{err:?}");
        assert!(err.to_string().contains("no tensor named `v` (it has: k, q)"), "{err}");
    }

    #[test]
    fn wrong_rank_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qkv.safetensors");
        let [q, _, v] = qkv(FileDType::F32);
        let k = tensor(&[5, 2, 8], FileDType::F32, 2);
        write_tensors(&path, &[("q", &q), ("k", &k), ("v", &v)]).unwrap();
        let err = read_qkv(&path).unwrap_err();
        assert!(matches!(&err, IoError::WrongRank { name: "k", shape, .. } if shape == &[5, 2, 8]), "{err:?}");
    }

    #[test]
    fn wrong_or_mixed_dtypes_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qkv.safetensors");
        let [q, k, v] = qkv(FileDType::F16);
        let ints = [0u8; 4 * 2 * 5 * 2 * 8];
        let int_v = TensorView::new(Dtype::I32, v.shape.clone(), &ints).unwrap();
        let (q_bytes, k_bytes) = (encode(q.dtype, &q.data), encode(k.dtype, &k.data));
        let views = [
            ("q", TensorView::new(Dtype::F16, q.shape.clone(), &q_bytes).unwrap()),
            ("k", TensorView::new(Dtype::F16, k.shape.clone(), &k_bytes).unwrap()),
            ("v", int_v),
        ];
        std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
        let err = read_qkv(&path).unwrap_err();
        assert!(matches!(&err, IoError::WrongDType { name: "v", dtype, .. } if dtype == "I32"), "{err:?}");

        let v = HostTensor { dtype: FileDType::BF16, ..v };
        write_tensors(&path, &[("q", &q), ("k", &k), ("v", &v)]).unwrap();
        let err = read_qkv(&path).unwrap_err();
        assert!(err.to_string().contains("`v` in") && err.to_string().contains("is BF16; expected F16 like `q`"), "{err}");
    }

    #[test]
    fn io_and_format_errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.safetensors");
        let err = read_qkv(&path).unwrap_err();
        assert!(matches!(err, IoError::Read { .. }) && err.to_string().contains("absent.safetensors"), "{err}");

        std::fs::write(&path, b"not a safetensors file").unwrap();
        let err = read_qkv(&path).unwrap_err();
        assert!(matches!(err, IoError::Format { .. }) && err.to_string().contains("absent.safetensors"), "{err}");

        let o = tensor(&[1, 1, 1, 2], FileDType::F32, 0);
        let err = write_tensors(&dir.path().join("no/such/dir.safetensors"), &[("o", &o), ("lse", &o)]).unwrap_err();
        assert!(matches!(err, IoError::Write { .. }), "{err:?}");
    }

    #[test]
    fn values_that_do_not_fill_the_shape_are_refused_on_write() {
        let dir = tempfile::tempdir().unwrap();
        let o = tensor(&[1, 1, 1, 2], FileDType::F32, 0);
        let lse = HostTensor { shape: vec![1, 1, 2], dtype: FileDType::F32, data: vec![0.0] };
        let err = write_tensors(&dir.path().join("out.safetensors"), &[("o", &o), ("lse", &lse)]).unwrap_err();
        assert!(err.to_string().contains("tensor `lse` has 1 values, its shape [1, 1, 2] needs 2"), "{err}");
    }

    #[test]
    fn a_kv_cache_is_read_with_its_table_and_lengths() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.safetensors");
        let (q, pool) = (tensor(&[2, 1, 4, 8], FileDType::BF16, 1), tensor(&[5, 16, 2, 8], FileDType::BF16, 2));
        let int_bytes = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (table, lens) = (int_bytes(&[3, 1, 0, -1]), int_bytes(&[20, 7]));
        let (q_bytes, pool_bytes) = (encode(q.dtype, &q.data), encode(pool.dtype, &pool.data));
        let write = |table_dtype, table_shape: Vec<usize>| {
            let views = [
                ("q", TensorView::new(Dtype::BF16, q.shape.clone(), &q_bytes).unwrap()),
                ("k_cache", TensorView::new(Dtype::BF16, pool.shape.clone(), &pool_bytes).unwrap()),
                ("v_cache", TensorView::new(Dtype::BF16, pool.shape.clone(), &pool_bytes).unwrap()),
                ("block_table", TensorView::new(table_dtype, table_shape, &table).unwrap()),
                ("cache_seqlens", TensorView::new(Dtype::I32, vec![2], &lens).unwrap()),
            ];
            std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
        };
        write(Dtype::I32, vec![2, 2]);
        let kv = read_kvcache(&path).unwrap().expect("a KV cache");
        assert_eq!((kv.q, kv.k_cache, kv.v_cache.shape), (q.clone(), pool.clone(), pool.shape.clone()));
        assert_eq!(kv.block_table, Some((vec![3, 1, 0, -1], [2, 2])));
        assert_eq!(kv.cache_seqlens, Some(vec![20, 7]));
        assert!(kv.k_new.is_none() && kv.v_new.is_none());
        write(Dtype::F32, vec![4]);
        let err = read_kvcache(&path).err().unwrap();
        assert!(matches!(&err, IoError::WrongDType { name: "block_table", .. }), "{err:?}");
        write(Dtype::I32, vec![4]);
        let err = read_kvcache(&path).err().unwrap();
        assert!(matches!(&err, IoError::WrongShape { name: "block_table", .. }), "{err:?}");
        let [q, k, v] = qkv(FileDType::F16);
        write_tensors(&path, &[("q", &q), ("k", &k), ("v", &v)]).unwrap();
        assert!(read_kvcache(&path).unwrap().is_none(), "no k_cache: not a KV cache");
    }

    #[test]
    fn the_output_gradient_is_optional_and_shaped_like_the_output() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qkv.safetensors");
        let [q, k, v] = qkv(FileDType::F32);
        write_tensors(&path, &[("q", &q), ("k", &k), ("v", &v)]).unwrap();
        let d = q.shape[3];
        assert_eq!(read_dout(&path, &q, d).unwrap(), None);
        let dout = tensor(&q.shape, FileDType::F32, 7);
        write_tensors(&path, &[("q", &q), ("k", &k), ("v", &v), ("do", &dout)]).unwrap();
        assert_eq!(read_dout(&path, &q, d).unwrap(), Some(dout.clone()));
        let err = read_dout(&path, &q, d + 8).unwrap_err();
        assert!(matches!(err, IoError::WrongShape { name: "do", .. }), "V's own head dim: do is the output's shape: {err:?}");
        write_tensors(&path, &[("q", &q), ("k", &k), ("v", &v), ("do", &k)]).unwrap();
        let err = read_dout(&path, &q, d).unwrap_err();
        assert!(matches!(err, IoError::WrongShape { name: "do", .. }), "{err:?}");
    }
}
