"""The wheel itself, on any machine (CI has no GPU and no torch): name, abi3 tag, contents, no
link to libtorch / libpython / the CUDA runtime, the extension's argument and error handling
(its native entry points' too, and their C structs written alike in Rust and in C++),
`device_info` without a GPU, and the NVRTC discovery. Run: `pytest --noconftest
python/tests/test_wheel.py`, with the wheel in $FLASHCORE_WHEEL (else the newest under
target/wheels)."""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import re
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The NVRTC of the test run (scripts/test.sh sets it), read before any test changes the environment.
NVRTC = os.environ.get("FLASHCORE_NVRTC")

# The extension's call and options tuples for a dense call on device 0, default options.
CALL = (0, 0, lambda n: 0, False)
OPTIONS = (None, False, -1, -1, 0.0, None, False, 0)


@pytest.fixture(scope="module")
def wheel() -> Path:
    path = os.environ.get("FLASHCORE_WHEEL")
    if path:
        return Path(path)
    found = sorted((ROOT / "target" / "wheels").glob("flashcore_attn-*.whl"), key=lambda p: p.stat().st_mtime)
    assert found, "no wheel: build one with `maturin build -m python/Cargo.toml -o target/wheels`"
    return found[-1]


@pytest.fixture(scope="module")
def unpacked(wheel, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(out)
    return out


@pytest.fixture(scope="module")
def ext(unpacked):
    """The extension module, loaded on its own (the package's __init__ imports torch where one is installed)."""
    (so,) = (unpacked / "flashcore").glob("_flashcore*.so")
    loader = importlib.machinery.ExtensionFileLoader("flashcore._flashcore", str(so))
    spec = importlib.util.spec_from_file_location("flashcore._flashcore", so, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture
def device(unpacked, ext, monkeypatch):
    """`flashcore._device` as the package imports it, without the package's __init__ (which
    needs torch) and with a torch whose CUDA sees no driver, as on a machine without a GPU."""
    package = types.ModuleType("flashcore")
    package.__path__ = [str(unpacked / "flashcore")]
    monkeypatch.setitem(sys.modules, "flashcore", package)
    monkeypatch.setitem(sys.modules, "flashcore._flashcore", ext)

    def current_device():
        raise RuntimeError("Found no NVIDIA driver on your system")

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False, current_device=current_device)))
    spec = importlib.util.spec_from_file_location("flashcore._device", unpacked / "flashcore" / "_device.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bare_machine(tmp_path, monkeypatch):
    """An environment where the NVRTC search sees none of this test run's: no FLASHCORE_NVRTC,
    CUDA_HOME or active environment, an empty home and working folder, and a PATH of only
    `tmp_path/bin` (for a fake python3)."""
    for var in ("FLASHCORE_NVRTC", "CUDA_HOME", "CUDA_PATH", "VIRTUAL_ENV", "CONDA_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "bin").mkdir()
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def fake_python3(bin_dir: Path, *sites: Path) -> None:
    """A `python3` in `bin_dir` that reports `sites` as its site-packages."""
    script = bin_dir / "python3"
    script.write_text("#!/bin/sh\n" + "".join(f"echo '{s}'\n" for s in sites))
    script.chmod(0o755)


def nvrtc_wheel(site: Path) -> Path:
    """Where the nvidia-cuda-nvrtc (CUDA 13) wheel puts libnvrtc in `site`, folders made."""
    lib = site / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13"
    lib.parent.mkdir(parents=True)
    return lib


def test_distribution_is_flashcore_attn_importing_as_flashcore(wheel):
    assert wheel.name.startswith("flashcore_attn-"), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        assert metadata.startswith("flashcore_attn-") and "Name: flashcore-attn\n" in z.read(metadata).decode(), metadata
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"flashcore"}


def test_one_abi3_wheel_for_cpython_3_9_and_later(wheel):
    assert "-cp39-abi3-" in wheel.name and "manylinux" in wheel.name and wheel.name.endswith("x86_64.whl")


def test_wheel_holds_the_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    compat = ("compat/__init__.py", "compat/flash_attn/__init__.py", "compat/flash_attn/flash_attn_interface.py", "compat/flash_attn/bert_padding.py")
    compat += ("compat/flash_attn/layers/__init__.py", "compat/flash_attn/layers/rotary.py")
    for f in ("__init__.py", "_ops.py", "interface.py", "flash_attn_interface.py", "paging.py", "rotary.py", "_device.py", "_nvrtc.py", "_native.py", "native/attention.cpp", "integrations/transformers.py", *compat, "py.typed", "_flashcore.pyi", "_flashcore.abi3.so"):
        assert f"flashcore/{f}" in names, f


def test_extension_links_neither_torch_nor_python_nor_cudart(unpacked):
    (so,) = (unpacked / "flashcore").glob("_flashcore*.so")
    dynamic = subprocess.run(["readelf", "-d", str(so)], check=True, capture_output=True, text=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert needed, dynamic
    for lib in needed:
        assert not lib.startswith(("libtorch", "libc10", "libpython", "libcudart", "libcuda.", "libnvrtc")), needed


def test_bad_dtype_is_a_type_error_before_any_gpu_work(ext):
    t = (0x1000, (1, 16, 4, 64), (4096, 256, 64, 1), "bf16")
    bad = (0x1000, (1, 16, 4, 64), (4096, 256, 64, 1), "f32")
    with pytest.raises(TypeError, match=r"dtype of `k`: f32 is not supported"):
        ext.attention_forward(CALL, (t, bad, t), (t, None), OPTIONS)


def test_bad_window_softcap_and_chunk_are_value_errors_before_any_gpu_work(ext):
    shape = (1, 16, 4, 64)
    with pytest.raises(ValueError, match=r"parameter `window`: \(-2, 0\): each side must be -1"):
        ext.plan(0, shape, shape, "bf16", (None, False, -2, 0, 0.0, None, False, 0))
    with pytest.raises(ValueError, match=r"parameter `softcap`: NaN must be 0 \(off\), or finite and > 0"):
        ext.plan(0, shape, shape, "bf16", (None, True, 127, 0, float("nan"), None, False, 0))
    with pytest.raises(ValueError, match=r"parameter `attention_chunk`: 2147483648 must be at most 2147483647"):
        ext.plan(0, shape, shape, "bf16", (None, True, -1, -1, 0.0, None, False, 2**31))


def abi_structs_cpp(text: str) -> dict:
    """`struct Native... { ... };` of native/attention.cpp as {name: [(field, type)]}, types in
    Rust's spelling (function pointers "fn", data pointers "ptr")."""
    types_ = {"uint64_t": "u64", "int64_t": "i64", "int32_t": "i32", "float": "f32", "void*": "ptr"}
    structs = {}
    for name, body in re.findall(r"struct (Native\w+) \{(.*?)\};", text, re.S):
        fields = []
        for decl in (d.strip() for d in body.split(";")):
            decl = re.sub(r"//.*", "", decl).strip()
            if not decl:
                continue
            if "(*" in decl:
                fields.append((re.search(r"\(\*(\w+)\)", decl).group(1), "fn"))
                continue
            kind, names = decl.split(None, 1)
            for part in (p.strip() for p in names.split(",")):
                array = re.fullmatch(r"(\w+)\[(\d+)\]", part)
                if array:
                    fields.append((array.group(1), f"[{types_[kind]}; {array.group(2)}]"))
                elif part.startswith("*"):
                    fields.append((part[1:], "ptr"))
                else:
                    fields.append((part, types_.get(kind, kind)))
        structs[name] = fields
    return structs


def abi_structs_rust(text: str) -> dict:
    """`#[repr(C)]` `pub struct Native... { ... }` of python/src/native.rs, as `abi_structs_cpp`."""
    structs = {}
    for name, body in re.findall(r"#\[repr\(C\)\]\s*(?:#\[derive\([^)]*\)\]\s*)?pub struct (Native\w+) \{(.*?)\n\}", text, re.S):
        fields = []
        for line in body.strip().splitlines():
            field, kind = (s.strip().rstrip(",") for s in line.split(":", 1))
            fields.append((field, "fn" if "fn(" in kind else "ptr" if kind.startswith("*mut") else kind))
        structs[name] = fields
    return structs



CTYPES = {"u64": ctypes.c_uint64, "i64": ctypes.c_int64, "i32": ctypes.c_int32, "f32": ctypes.c_float, "fn": ctypes.c_void_p, "ptr": ctypes.c_void_p}


def native_structs() -> dict:
    """native.rs's C structs as ctypes types, made from its source (`abi_structs_rust`), so the
    test below calls the entry point with the layout the extension was built with."""
    defs = abi_structs_rust((ROOT / "python" / "src" / "native.rs").read_text())
    made: dict = {}

    def make(name):
        if name not in made:
            fields = []
            for field, kind in defs[name]:
                array = re.fullmatch(r"\[(\w+); (\d+)\]", kind)
                fields.append((field, CTYPES[array.group(1)] * int(array.group(2)) if array else CTYPES.get(kind) or make(kind)))
            made[name] = type(name, (ctypes.Structure,), {"_fields_": fields})
        return made[name]

    for name in defs:
        make(name)
    return made


def native_forward(ext, dtype_code: int) -> tuple:
    """Calls the native path's forward entry point (as native/attention.cpp does) on made-up
    addresses, k with `dtype_code`: `(status, message)`."""
    abi, forward, _ = ext.native_entry_points()
    assert str(abi) == re.search(r"pub const ABI_VERSION: u64 = (\d+);", (ROOT / "python" / "src" / "native.rs").read_text()).group(1)
    assert forward != 0
    structs = native_structs()
    shape, strides = (ctypes.c_int64 * 4)(1, 16, 4, 64), (ctypes.c_int64 * 4)(4096, 256, 64, 1)
    t, bad = (structs["NativeTensor"](0x1000, shape, strides, code) for code in (1, dtype_code))
    args = structs["NativeForward"](call=structs["NativeCall"](device=0), q=t, k=bad, v=t, o=t)
    entry = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(structs["NativeForward"]), ctypes.c_char_p, ctypes.c_size_t)(forward)
    message = ctypes.create_string_buffer(512)
    return entry(ctypes.byref(args), message, len(message)), message.value.decode()


def test_native_entry_point_refuses_a_bad_dtype_with_type_error_status_and_text(ext):
    assert native_forward(ext, 7) == (1, "dtype of `k`: dtype code 7 (0 float16, 1 bfloat16)")


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has a GPU: the no-GPU error cannot be seen")
def test_native_entry_point_without_a_gpu_is_a_runtime_error_status(ext):
    status, message = native_forward(ext, 1)
    assert status == 4 and "no usable GPU" in message, (status, message)


def test_run_head_dim_names_an_unknown_call_before_it_looks_for_a_gpu(ext):
    with pytest.raises(ValueError, match="unknown call \"decode\": attention, dropout or paged_queries"):
        ext.run_head_dim(0, 40, "decode")


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has a GPU: the call would launch on made-up addresses")
def test_no_gpu_is_a_runtime_error_not_a_crash(ext):
    t = (0x1000, (1, 16, 4, 64), (4096, 256, 64, 1), "bf16")
    with pytest.raises(RuntimeError, match="no usable GPU"):
        ext.attention_forward(CALL, (t, t, t), (t, None), OPTIONS)


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has a GPU: the no-GPU answer cannot be seen")
def test_device_info_without_a_gpu_says_so_and_names_the_nvrtc(device):
    info = device.device_info()
    assert list(info) == ["gpu", "gpu_error", "nvrtc", "nvrtc_version", "nvrtc_error"]
    assert info["gpu"] is None and info["gpu_error"].startswith("no usable GPU: "), info
    if NVRTC:
        assert info["nvrtc"] == NVRTC and re.fullmatch(r"\d+\.\d+", info["nvrtc_version"]) and info["nvrtc_error"] is None, info
    else:
        assert info["nvrtc"] is not None or info["nvrtc_error"].startswith("NVRTC not found: "), info


def test_import_without_torch_gives_device_info_and_one_error_naming_torch(unpacked):
    """`import flashcore` where no torch can be imported (`-S -I`: no site-packages, so the
    same on a machine with torch installed): it imports, `device_info()` answers, and a name
    that needs torch raises one ImportError that names it."""
    script = (
        "import flashcore\n"
        "info = flashcore.device_info(0)\n"
        "assert set(info) == {'gpu', 'gpu_error', 'nvrtc', 'nvrtc_version', 'nvrtc_error'}, info\n"
        "assert (info['gpu'] is None) != (info['gpu_error'] is None), info\n"
        "try:\n"
        "    flashcore.flash_attn_func\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    raise SystemExit('flash_attn_func without torch did not raise')\n"
    )
    run = subprocess.run([sys.executable, "-S", "-I", "-c", f"import sys; sys.path.insert(0, {str(unpacked)!r})\n{script}"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    (line,) = run.stdout.splitlines()
    assert "PyTorch" in line and "pip install 'torch" in line and "flash_attn_func" in line, line


def test_nvrtc_not_found_names_every_place_searched_and_the_fix(device, bare_machine):
    site, user = bare_machine / "site-packages", bare_machine / "user-site"
    broken = nvrtc_wheel(site)
    broken.write_bytes(b"not a library")
    fake_python3(bare_machine / "bin", site, user)
    info = device.device_info(99)
    if info["nvrtc"] is not None:
        pytest.skip(f"this machine has NVRTC in a system place: {info['nvrtc']}")
    lines = info["nvrtc_error"].splitlines()
    assert lines[0] == "NVRTC not found: no loadable libnvrtc in any of these places:", lines
    for place in (
        "/usr/local/cuda/{lib64,lib,targets/x86_64-linux/lib}",
        "libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so on the dynamic loader's path (LD_LIBRARY_PATH, /etc/ld.so.cache)",
        f"{Path.cwd() / '.venv'}/lib/python3*/site-packages: no such folder",
        f"{bare_machine / 'home' / '.local'}/lib/python3*/site-packages: no such folder",
        f"{site}/nvidia/{{cu13,cuda_nvrtc,cu12}}/lib (python3 on PATH)",
        f"{user}/nvidia/{{cu13,cuda_nvrtc,cu12}}/lib (python3 on PATH)",
    ):
        assert f"  {place}" in lines, (place, lines)
    assert lines[lines.index("found but not loadable:") + 1].startswith(f"  {broken}: "), lines
    assert lines[-1] == "fix: `pip install nvidia-cuda-nvrtc` (or install the CUDA toolkit), or set FLASHCORE_NVRTC=/path/to/libnvrtc.so"


@pytest.mark.skipif(not NVRTC, reason="needs a real libnvrtc in FLASHCORE_NVRTC (scripts/test.sh sets it)")
def test_nvrtc_in_the_site_packages_of_python3_on_path_is_found(device, bare_machine):
    lib = nvrtc_wheel(bare_machine / "user-site")
    lib.symlink_to(NVRTC)
    fake_python3(bare_machine / "bin", bare_machine / "user-site")
    info = device.device_info(99)
    if info["nvrtc"] is not None and not info["nvrtc"].startswith(str(bare_machine)):
        pytest.skip(f"this machine has NVRTC in a system place: {info['nvrtc']}")
    assert info["nvrtc"] == str(lib) and info["nvrtc_error"] is None, info


def test_nvrtc_of_torch_wheels_is_found(unpacked, tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("flashcore_nvrtc", unpacked / "flashcore" / "_nvrtc.py")
    nvrtc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nvrtc)
    lib = tmp_path / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere"), str(tmp_path)])
    monkeypatch.delenv("FLASHCORE_NVRTC", raising=False)
    assert nvrtc.torch_nvrtc() == lib
    nvrtc.use_torch_nvrtc()
    assert os.environ["FLASHCORE_NVRTC"] == str(lib)
    monkeypatch.setenv("FLASHCORE_NVRTC", "/explicit/libnvrtc.so")
    nvrtc.use_torch_nvrtc()
    assert os.environ["FLASHCORE_NVRTC"] == "/explicit/libnvrtc.so", "an explicit choice wins"


def test_cache_dir_is_flashcore_cache_dir_else_the_user_cache(ext, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHCORE_CACHE_DIR", str(tmp_path / "kernels"))
    assert ext.cache_dir() == str(tmp_path / "kernels")
    monkeypatch.delenv("FLASHCORE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ext.cache_dir() == str(tmp_path / "xdg" / "flashcore")


def test_a_cache_other_users_can_write_is_refused_by_name(ext, tmp_path, monkeypatch):
    """The caches' trust rule, as the native path's loader asks it (`_native._cache_dir`): its
    folder is created private; a cache directory every user can write is refused, naming the
    directory, its mode and FLASHCORE_CACHE_DIR, and nothing is created in it."""
    cache = tmp_path / "kernels"
    monkeypatch.setenv("FLASHCORE_CACHE_DIR", str(cache))
    native = Path(ext.private_cache_dir("native"))
    assert native == cache / "native" and (cache.stat().st_mode & 0o777, native.stat().st_mode & 0o777) == (0o700, 0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("FLASHCORE_CACHE_DIR", str(shared))
    with pytest.raises(PermissionError, match=rf"refusing the cache {re.escape(str(shared))}: mode 0777.*FLASHCORE_CACHE_DIR"):
        ext.private_cache_dir("native")
    assert not (shared / "native").exists()


def test_a_planted_library_is_refused_before_it_is_loaded(ext, tmp_path):
    """A library in the cache that another user could have written (mode 0666) is refused by
    name (`_native._load` asks before `torch.ops.load_library`); the user's own is not."""
    planted = tmp_path / "attention-0123.so"
    planted.write_bytes(b"\x7fELF not yours")
    planted.chmod(0o666)
    with pytest.raises(PermissionError, match=rf"refusing the cache {re.escape(str(planted))}: mode 0666, writable by every user"):
        ext.check_cache_file(str(planted))
    planted.chmod(0o644)
    ext.check_cache_file(str(planted))


def test_native_abi_structs_agree_between_rust_and_cpp():
    """The native path's C contract is written twice, in python/src/native.rs and in
    python/flashcore/native/attention.cpp (which CI cannot compile: it has no torch): the
    same structs, the same fields in the same order, the same types."""
    cpp = abi_structs_cpp((ROOT / "python" / "flashcore" / "native" / "attention.cpp").read_text())
    rust = abi_structs_rust((ROOT / "python" / "src" / "native.rs").read_text())
    assert set(cpp) == set(rust) == {"NativeTensor", "NativeOptions", "NativeVarlen", "NativeScratch", "NativeCall", "NativeForward", "NativeBackward"}, (cpp.keys(), rust.keys())
    for name in rust:
        assert cpp[name] == rust[name], f"{name}: C++ {cpp[name]} against Rust {rust[name]}"
    abi_cpp = re.search(r"constexpr int64_t kAbiVersion = (\d+);", (ROOT / "python" / "flashcore" / "native" / "attention.cpp").read_text())
    abi_rust = re.search(r"pub const ABI_VERSION: u64 = (\d+);", (ROOT / "python" / "src" / "native.rs").read_text())
    assert abi_cpp and abi_rust and abi_cpp.group(1) == abi_rust.group(1)
