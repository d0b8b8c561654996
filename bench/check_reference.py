#!/usr/bin/env python3
"""Cross-check `flashcore attn --cpu` (the Rust f64 reference) against NumPy, independently.

For each case: random f32 q, k, v (BSHD) and an output gradient `do` go to
qkv.safetensors; `flashcore attn --cpu --f64-out` writes o [B, Sq, Hq, D], lse [B, Hq, Sq]
and the gradients dq, dk, dv as F64; NumPy recomputes all of them in float64 (the gradients
vectorised, themselves checked against finite differences in the self-test) and the two
must agree to 1e-12 (relative L2 for o and the gradients, per element for lse; fully masked
rows must be o = 0, lse = -inf in both).

Usage:
    check_reference.py [FLASHCORE_BIN]   # default: $FLASHCORE_BIN, else target/release/flashcore
    check_reference.py --self-test      # NumPy attention vs a brute-force loop; no binary needed

Needs only numpy and safetensors (pip install numpy safetensors).
"""

import math
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file

TOL = 1e-12

# (name, B, Sq, Sk, Hq, Hkv, D, causal, scale, logit_gain). scale None = the default
# 1/sqrt(D); those cases use D = 16, 64 or 256 so that 1/sqrt(D) is exact in f32 and f64
# alike. Explicit scales are rounded to f32 (the API's type) and passed exactly.
# logit_gain multiplies q to reach large logits (~±30).
CASES = [
    ("non-causal", 2, 64, 80, 4, 4, 64, False, None, 1.0),
    ("causal Sq=Sk", 2, 96, 96, 4, 4, 64, True, None, 1.0),
    ("causal Sq<Sk", 1, 37, 100, 2, 2, 32, True, 0.3, 1.0),
    ("causal Sq>Sk (masked rows)", 1, 100, 37, 2, 2, 16, True, None, 1.0),
    ("GQA 8/2 non-causal", 2, 48, 70, 8, 2, 64, False, 0.2, 1.0),
    ("GQA 8/2 causal", 2, 70, 70, 8, 2, 64, True, None, 1.0),
    ("MQA 4/1 decode Sq=1", 3, 1, 257, 4, 1, 128, True, 0.0883883, 1.0),
    ("large logits", 1, 33, 65, 2, 1, 256, False, None, 6.0),
]


def attention(q, k, v, scale, causal):
    """float64 attention: GQA by repeating kv heads, bottom-right aligned causal mask."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    _, sq, hq, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    k = np.repeat(k, hq // hkv, axis=2)
    v = np.repeat(v, hq // hkv, axis=2)
    s = scale * np.einsum("bqhd,bkhd->bhqk", q, k)
    if causal:
        i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
        s = np.where(j <= i + sk - sq, s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if sk else np.full(s.shape[:-1] + (1,), -np.inf)
    m = np.where(np.isfinite(m), m, 0.0)  # Fully masked row: exp(-inf - 0) = 0, no NaN.
    p = np.exp(s - m)
    total = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(total))[..., 0]
    o = np.einsum("bhqk,bkhd->bqhd", p / np.where(total > 0, total, 1.0), v)
    return o, lse


def attention_grads(q, k, v, dout, scale, causal):
    """float64 gradients (dq, dk, dv) of sum(dout * o): P = softmax(S), dV = P^T dO,
    dS = P * (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q; the query heads
    of a kv head add their dK and dV."""
    q, k, v, dout = (np.asarray(t, dtype=np.float64) for t in (q, k, v, dout))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    kr, vr = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    o, lse = attention(q, k, v, scale, causal)
    s = scale * np.einsum("bqhd,bkhd->bhqk", q, kr)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - lse[..., None])
    if causal:
        i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
        p = np.where(j <= i + sk - sq, p, 0.0)
    p = np.nan_to_num(p, nan=0.0)  # rows that see no key: lse = -inf
    ds = p * (np.einsum("bqhd,bkhd->bhqk", dout, vr) - np.einsum("bqhd,bqhd->bhq", dout, o)[..., None])
    dq = scale * np.einsum("bhqk,bkhd->bqhd", ds, kr)
    dk = scale * np.einsum("bhqk,bqhd->bkhd", ds, q).reshape(b, sk, hkv, group, d).sum(axis=3)
    dv = np.einsum("bhqk,bqhd->bkhd", p, dout).reshape(b, sk, hkv, group, d).sum(axis=3)
    return dq, dk, dv


def rel_l2(x, ref):
    norm = np.linalg.norm(ref)
    return np.linalg.norm(x - ref) / (norm if norm > 0 else 1.0)


def brute_force(q, k, v, scale, causal):
    """The same thing one scalar at a time, for the self-test."""
    b_, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    o = np.zeros((b_, sq, hq, d))
    lse = np.full((b_, hq, sq), -np.inf)
    for b in range(b_):
        for h in range(hq):
            kh = h // (hq // hkv)
            for i in range(sq):
                keys = [j for j in range(sk) if not causal or j - i <= sk - sq]
                if not keys:
                    continue
                logits = [scale * sum(float(q[b, i, h, c]) * float(k[b, j, kh, c]) for c in range(d)) for j in keys]
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights)
                lse[b, h, i] = top + math.log(total)
                for w, j in zip(weights, keys):
                    for c in range(d):
                        o[b, i, h, c] += w / total * float(v[b, j, kh, c])
    return o, lse


def compare(o, lse, o_ref, lse_ref):
    """Returns (ok, message): relative L2 error of o, max error of lse, -inf pattern of lse."""
    if o.shape != o_ref.shape or lse.shape != lse_ref.shape:
        return False, f"shapes o {o.shape} lse {lse.shape}, expected {o_ref.shape} {lse_ref.shape}"
    if np.isnan(o).any() or np.isnan(lse).any():
        return False, "NaN in output"
    masked = np.isneginf(lse_ref)
    if (np.isneginf(lse) != masked).any():
        return False, f"lse is -inf on {np.isneginf(lse).sum()} rows, expected {masked.sum()}"
    norm = np.linalg.norm(o_ref)
    o_err = np.linalg.norm(o - o_ref) / (norm if norm > 0 else 1.0)
    lse_err = float(np.max(np.abs(lse[~masked] - lse_ref[~masked]) / np.maximum(1.0, np.abs(lse_ref[~masked])), initial=0.0))
    ok = o_err < TOL and lse_err < TOL
    return ok, f"o rel {o_err:.1e}, lse {lse_err:.1e}" + (f", {masked.sum()} masked rows" if masked.any() else "")


def random_qkv(rng, b, sq, sk, hq, hkv, d, gain):
    q = (gain * rng.standard_normal((b, sq, hq, d))).astype(np.float32)
    k = rng.standard_normal((b, sk, hkv, d)).astype(np.float32)
    v = rng.standard_normal((b, sk, hkv, d)).astype(np.float32)
    return q, k, v


def report(results):
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


def run_oracle(binary, qkv_path, out_path, causal, label, results, extra=()):
    """`flashcore attn --cpu --f64-out` on the saved input: its outputs, or None after a FAIL line."""
    cmd = [binary, "attn", "--cpu", "--input", qkv_path, "--output", out_path, "--f64-out", *extra] + (["--causal"] if causal else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"FAIL {label}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
        results.append(False)
        return None
    return load_file(out_path)


def expect_refusal(binary, tensors, qkv_path, out_path, label, *needles):
    """The CLI refuses `tensors` with an error that names each of `needles`."""
    save_file(tensors, qkv_path)
    proc = subprocess.run([binary, "attn", "--cpu", "--input", qkv_path, "--output", out_path], capture_output=True, text=True)
    ok = proc.returncode != 0 and all(n in proc.stderr for n in needles)
    print(f"{'PASS' if ok else 'FAIL'} {label:28} refused by name: {proc.stderr.strip()[-200:]}")
    return ok


def run_cases(binary):
    if not os.path.isfile(binary):
        print(f"flashcore binary not found at {binary} (pass its path or set FLASHCORE_BIN)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        qkv_path, out_path = os.path.join(tmp, "qkv.safetensors"), os.path.join(tmp, "out.safetensors")
        for name, b, sq, sk, hq, hkv, d, causal, scale, gain in CASES:
            q, k, v = random_qkv(rng, b, sq, sk, hq, hkv, d, gain)
            dout = rng.standard_normal(q.shape).astype(np.float32)
            save_file({"q": q, "k": k, "v": v, "do": dout}, qkv_path)
            if scale is not None:
                scale = float(np.float32(scale))
            label = f"{name:28} B{b} Sq{sq} Sk{sk} H{hq}/{hkv} D{d}"
            out = run_oracle(binary, qkv_path, out_path, causal, label, results, ["--scale", repr(scale)] if scale is not None else [])
            if out is None:
                continue
            if out["o"].dtype != np.float64 or out["lse"].dtype != np.float64:
                print(f"FAIL {label}: o is {out['o'].dtype}, lse {out['lse'].dtype}; --f64-out wants float64")
                results.append(False)
                continue
            used_scale = scale if scale is not None else 1.0 / np.sqrt(d)
            o_ref, lse_ref = attention(q, k, v, used_scale, causal)
            ok, msg = compare(out["o"], out["lse"], o_ref, lse_ref)
            grad_errs = [rel_l2(out[n], g) for n, g in zip(("dq", "dk", "dv"), attention_grads(q, k, v, dout, used_scale, causal))]
            ok = ok and max(grad_errs) < TOL
            msg += ", grads rel " + "/".join(f"{e:.1e}" for e in grad_errs)
            print(f"{'PASS' if ok else 'FAIL'} {label}: {msg}")
            results.append(ok)
        results.extend(run_packed(binary, rng, qkv_path, out_path))
        results.extend(run_kvcache(binary, rng, qkv_path, out_path))
    return report(results)


def run_packed(binary, rng, qkv_path, out_path):
    """A packed (varlen) batch through `attn --cpu`: q [total_q, H, D] with int32 cu_seqlens
    (one sequence without queries, one without keys, Sq > Sk, seqused_k with slack) and `do`
    against NumPy's attention and gradients of each sequence alone (zero gradients for keys no
    query sees, past seqused_k included); then a decreasing cu_seqlens_q, which must be
    refused naming it."""
    lens = [(5, 9), (0, 4), (3, 0), (17, 6), (1, 30)]
    slack = [0, 2, 1, 0, 3]
    hq, hkv, d, results = 4, 2, 16, []
    for causal in (False, True):
        seqs = [random_qkv(rng, 1, sq, sk + extra, hq, hkv, d, 1.0) for (sq, sk), extra in zip(lens, slack)]
        cu = lambda n: np.concatenate([[0], np.cumsum(n)]).astype(np.int32)  # noqa: E731
        tensors = {
            "q": np.concatenate([s[0][0] for s in seqs]),
            "k": np.concatenate([s[1][0] for s in seqs]),
            "v": np.concatenate([s[2][0] for s in seqs]),
            "cu_seqlens_q": cu([sq for sq, _ in lens]),
            "cu_seqlens_k": cu([sk + e for (_, sk), e in zip(lens, slack)]),
            "seqused_k": np.array([sk for _, sk in lens], dtype=np.int32),
            "do": rng.standard_normal((sum(sq for sq, _ in lens), hq, d)).astype(np.float32),
        }
        save_file(tensors, qkv_path)
        label = f"{'packed causal' if causal else 'packed':28} lengths {lens} seqused_k"
        out = run_oracle(binary, qkv_path, out_path, causal, label, results)
        if out is None:
            continue
        o_ref, lse_ref, grads = [], [], [[], [], []]
        q0 = 0
        for (q, k, v), (sq, sk), extra in zip(seqs, lens, slack):
            dout = tensors["do"][None, q0 : q0 + sq]
            q0 += sq
            if sk == 0:
                o, lse = np.zeros((1, sq, hq, d)), np.full((1, hq, sq), -np.inf)
                g = (np.zeros((1, sq, hq, d)), np.zeros((1, 0, hkv, d)), np.zeros((1, 0, hkv, d)))
            else:
                o, lse = attention(q, k[:, :sk], v[:, :sk], 1.0 / np.sqrt(d), causal)
                g = attention_grads(q, k[:, :sk], v[:, :sk], dout, 1.0 / np.sqrt(d), causal)
            o_ref.append(o[0])
            lse_ref.append(lse[0])
            unused = np.zeros((extra, hkv, d))
            for i, (part, pad) in enumerate(zip(g, (None, unused, unused))):
                grads[i].append(part[0] if pad is None else np.concatenate([part[0], pad]))
        ok, msg = compare(out["o"], out["lse"], np.concatenate(o_ref), np.concatenate(lse_ref, axis=1))
        errs = [rel_l2(out[name], np.concatenate(parts)) for name, parts in zip(("dq", "dk", "dv"), grads)]
        ok = ok and max(errs) < 1e-12
        msg += ", grads rel " + " ".join(f"{e:.1e}" for e in errs)
        print(f"{'PASS' if ok else 'FAIL'} {label}: {msg}")
        results.append(ok)
    tensors["cu_seqlens_q"] = np.array([0, 5, 4, 8, 25, 26], dtype=np.int32)
    results.append(expect_refusal(binary, tensors, qkv_path, out_path, "packed, bad cu_seqlens_q", "cu_seqlens_q", "decreases"))
    return results


def run_kvcache(binary, rng, qkv_path, out_path):
    """A KV cache through `attn --cpu`: cached lengths 1, 15, 16, 17 and 40 with 3 keys appended
    (across page boundaries) and 3 query rows, in shuffled pages of 16 keys (a block table) and
    in a contiguous cache; against NumPy's attention over each sequence's keys gathered by hand,
    and the caches after the append bit for bit; then a table entry outside the pool, which must
    be refused naming it."""
    page, hq, hkv, d, new, sq = 16, 4, 2, 16, 3, 3
    cached = [1, 15, 16, 17, 40]
    b, results = len(cached), []
    for paged, causal in ((True, False), (True, True), (False, True)):
        used = [-(-(c + new) // page) for c in cached]
        if paged:
            max_pages, num_pages = max(used) + 1, sum(used) + 2
            ids = iter(rng.permutation(num_pages).tolist())
            table = np.array([[next(ids) if s < n else -1 for s in range(max_pages)] for n in used], dtype=np.int32)
        else:  # sequence i is page i of one long page
            max_pages, num_pages, page = 1, b, 48
            table = np.arange(b, dtype=np.int32)[:, None]
        k_cache, v_cache = (rng.standard_normal((num_pages, page, hkv, d)).astype(np.float32) for _ in range(2))
        k_new, v_new = (rng.standard_normal((b, new, hkv, d)).astype(np.float32) for _ in range(2))
        q = rng.standard_normal((b, sq, hq, d)).astype(np.float32)
        tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "k_new": k_new, "v_new": v_new, "cache_seqlens": np.array(cached, dtype=np.int32)}
        if paged:
            tensors["block_table"] = table
        save_file(tensors, qkv_path)
        label = f"{'paged' if paged else 'contiguous'} cache{' causal' if causal else ''}".ljust(28) + f" lengths {cached} + {new}"
        out = run_oracle(binary, qkv_path, out_path, causal, label, results)
        if out is None:
            continue
        want_k, want_v = k_cache.copy(), v_cache.copy()
        o_ref, lse_ref = [], []
        for i, c in enumerate(cached):
            for j in range(new):
                slot = (table[i, (c + j) // page], (c + j) % page)
                want_k[slot], want_v[slot] = k_new[i, j], v_new[i, j]
            slots = [(table[i, p // page], p % page) for p in range(c + new)]
            keys, values = (np.stack([pool[s] for s in slots])[None] for pool in (want_k, want_v))
            o, lse = attention(q[i : i + 1], keys, values, 1.0 / np.sqrt(d), causal)
            o_ref.append(o)
            lse_ref.append(lse)
        ok, msg = compare(out["o"], out["lse"], np.concatenate(o_ref), np.concatenate(lse_ref))
        same = np.array_equal(out["k_cache"], want_k) and np.array_equal(out["v_cache"], want_v)
        print(f"{'PASS' if ok and same else 'FAIL'} {label}: {msg}, caches after the append {'exact' if same else 'DIFFER'}")
        results.append(ok and same)
    bad_table = dict(tensors, block_table=np.array([[0], [1], [2], [3], [b + 7]], dtype=np.int32))
    results.append(expect_refusal(binary, bad_table, qkv_path, out_path, "KV cache, bad block_table", "block_table", "[4, 0]"))
    return results


def self_test():
    rng = np.random.default_rng(1)
    results = []
    small = [("non-causal", 2, 5, 7, 2, 2, 3, False, 0.7),
             ("causal Sq=Sk", 1, 6, 6, 2, 1, 4, True, 0.5),
             ("causal Sq<Sk", 2, 3, 8, 4, 2, 2, True, 1.1),
             ("causal Sq>Sk", 1, 7, 3, 3, 3, 2, True, 0.9),
             ("GQA 8/2", 1, 4, 5, 8, 2, 3, True, 0.4),
             ("decode Sq=1", 2, 1, 9, 4, 1, 5, True, 0.3),
             ("large logits", 1, 3, 4, 1, 1, 8, False, 10.0)]
    for name, b, sq, sk, hq, hkv, d, causal, scale in small:
        q, k, v = random_qkv(rng, b, sq, sk, hq, hkv, d, 1.0)
        ok, msg = compare(*attention(q, k, v, scale, causal), *brute_force(q, k, v, scale, causal))
        print(f"{'PASS' if ok else 'FAIL'} self-test {name:14}: {msg}")
        results.append(ok)

    # The NumPy gradients against central finite differences of the NumPy forward.
    for causal, (sq, sk) in ((False, (3, 4)), (True, (4, 3))):
        q, k, v = (t.astype(np.float64) for t in random_qkv(rng, 1, sq, sk, 4, 2, 3, 1.0))
        dout = rng.standard_normal(q.shape)
        grads = attention_grads(q, k, v, dout, 0.8, causal)
        worst, h = 0.0, 1e-6
        for which, (x, g) in enumerate(zip((q, k, v), grads)):
            for idx in np.ndindex(x.shape):
                plus, minus = [t.copy() for t in (q, k, v)], [t.copy() for t in (q, k, v)]
                plus[which][idx] += h
                minus[which][idx] -= h
                numeric = (np.sum(attention(*plus, 0.8, causal)[0] * dout) - np.sum(attention(*minus, 0.8, causal)[0] * dout)) / (2 * h)
                worst = max(worst, abs(numeric - g[idx]))
        ok = worst < 1e-7
        print(f"{'PASS' if ok else 'FAIL'} self-test gradients vs finite differences (causal {causal}): max error {worst:.1e}")
        results.append(bool(ok))

    # The mask is bottom-right aligned: Sq = 3, Sk = 5 gives rows seeing 3, 4, 5 keys.
    q, k, v = random_qkv(rng, 1, 3, 5, 1, 1, 5, 1.0)
    v = np.eye(5, dtype=np.float32).reshape(1, 5, 1, 5)  # One-hot values: o holds the weights.
    o, _ = attention(q, k, v, 1.0, True)
    ok = ((o[0, :, 0] > 0).sum(axis=1) == [3, 4, 5]).all()
    print(f"{'PASS' if ok else 'FAIL'} self-test mask alignment: visible keys per row {(o[0, :, 0] > 0).sum(axis=1)}")
    results.append(bool(ok))

    # compare() must catch a small error and a wrongly masked row.
    o_ref, lse_ref = attention(*random_qkv(rng, 1, 6, 3, 2, 2, 4, 1.0), 0.5, True)
    caught = not compare(o_ref * (1 + 1e-9), lse_ref, o_ref, lse_ref)[0]
    caught &= not compare(o_ref, np.where(np.isneginf(lse_ref), 0.0, lse_ref), o_ref, lse_ref)[0]
    print(f"{'PASS' if caught else 'FAIL'} self-test compare() rejects a 1e-9 error and a wrong mask")
    results.append(bool(caught))

    # Inputs survive the safetensors round trip bit for bit.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "qkv.safetensors")
        q, k, v = random_qkv(rng, 1, 2, 3, 2, 1, 4, 1.0)
        save_file({"q": q, "k": k, "v": v}, path)
        back = load_file(path)
        ok = all(np.array_equal(back[n], t) and back[n].dtype == np.float32 for n, t in zip("qkv", (q, k, v)))
        print(f"{'PASS' if ok else 'FAIL'} self-test safetensors round trip")
        results.append(ok)
    return report(results)


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    if argv == ["--self-test"]:
        return self_test()
    if len(argv) > 1:
        print(__doc__, file=sys.stderr)
        return 2
    return run_cases(argv[0] if argv else os.environ.get("FLASHCORE_BIN", "target/release/flashcore"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
