//! The `ds4-quantize` command as the converter's tests run it, and what
//! they read back from its output.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

use ds4::backend::BackendKind;
use ds4::convert::decode::Weight;
use ds4::convert::safetensors::Checkpoint;
use ds4::gguf::GgufFile;
use ds4::model::any_model::AnyModel;
use ds4::model::forward::Numerics;
use ds4::quant::{self, GgmlType};
use ds4::session::{DraftModel, Session, SessionOptions};
use ds4::testmodel::Vocab;

/// Runs `ds4-quantize` with `args` to its exit.
pub fn quantize_tool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ds4-quantize"))
        .args(args)
        .output()
        .expect("ds4-quantize runs")
}

/// Checkpoint `ck` (called `key`) converted with `recipe` into
/// `fresh_dir(group, "out-{recipe}-{key}")/{file}-{recipe}.gguf`, once per
/// test binary, recipe and key; asserts the command succeeds and leaves only
/// the output in its folder (no partial file).
pub fn converted_once(group: &str, ck: &Path, key: &str, file: &str, recipe: &str) -> PathBuf {
    static DONE: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let done = DONE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
    let key = format!("{recipe}-{key}");
    if let Some(p) = done.get(&key) {
        return p.clone();
    }
    let dir = super::fresh_dir(group, &format!("out-{key}"));
    let out = dir.join(format!("{file}-{recipe}.gguf"));
    let o = convert(ck, recipe, &[], &out);
    assert!(
        o.status.success(),
        "--recipe {recipe}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(names.len(), 1, "{names:?}");
    done.insert(key, out.clone());
    out
}

/// `ds4 -m model -p prompt -n 4` greedy, without thinking, on the CPU
/// backend with a context of 256: how the converter's tests check that a
/// converted file answers; asserts it exits 0 without a panic.
pub fn ds4_answers(model: &Path, prompt: &str) {
    let o = Command::new(env!("CARGO_BIN_EXE_ds4"))
        .args(["-m", s(model), "-p", prompt, "-n", "4"])
        .args(["--temp", "0", "--nothink", "--backend", "cpu"])
        .args(["--ctx", "256"])
        .output()
        .expect("ds4 runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}: {err}", model.display());
    assert!(!err.contains("panicked"), "{err}");
}

/// `p` as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `ds4-quantize --hf checkpoint --recipe recipe [extra] -o out --quiet`.
pub fn convert(checkpoint: &Path, recipe: &str, extra: &[&str], out: &Path) -> Output {
    let mut args = vec!["--hf", s(checkpoint), "--recipe", recipe];
    args.extend_from_slice(extra);
    args.extend(["-o", s(out), "--quiet"]);
    quantize_tool(&args)
}

/// A vocabulary of `n` made-up tokens (the loader reads only its size).
pub fn small_vocab(n: usize) -> Vocab {
    Vocab {
        token_types: vec![1; n],
        tokens: (0..n).map(|i| format!("t{i}")).collect(),
        merges: Vec::new(),
    }
}

/// Every tensor's name, shape and type, in file order.
pub fn directory(f: &GgufFile) -> Vec<(String, Vec<u64>, GgmlType)> {
    f.tensor_infos()
        .iter()
        .map(|i| (i.name.clone(), i.ne.clone(), f.view(i).unwrap().ty))
        .collect()
}

/// Tensor `name` of `f`: its type, `ne0` and bytes.
pub fn tensor<'a>(f: &'a GgufFile, name: &str) -> (GgmlType, usize, &'a [u8]) {
    let i = f.tensor_info(name).unwrap_or_else(|| panic!("{name}"));
    let v = f.view(i).unwrap();
    (v.ty, i.ne[0] as usize, v.data)
}

/// A GGUF tensor dequantized to f32, row-major.
pub fn dequantize(f: &GgufFile, name: &str) -> Vec<f32> {
    let (ty, ne0, data) = tensor(f, name);
    let rb = ty.row_bytes(ne0 as u64).unwrap() as usize;
    let mut out = vec![0f32; data.len() / rb * ne0];
    for (src, dst) in data.chunks_exact(rb).zip(out.chunks_exact_mut(ne0)) {
        quant::dequantize_row(ty, src, dst).unwrap();
    }
    out
}

/// The largest |x| of each block of 32 of `v`.
pub fn block_max(v: &[f32]) -> Vec<f32> {
    v.chunks(32)
        .map(|b| b.iter().fold(0f32, |m, x| m.max(x.abs())))
        .collect()
}

/// Asserts Q8_0's bound between `got` (a Q8_0 tensor decoded) and `want`
/// (the values it was made from), per block of 32: d = amax/127 rounded
/// to f16 (relative error 2^-11), q rounded to nearest, so
/// |x − q·d| ≤ d/2 + 127·d·2^-11 = amax/254 + amax/2048.
pub fn assert_within_q8_0(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}");
    for (k, (amax, (g, w))) in block_max(want)
        .iter()
        .zip(got.chunks(32).zip(want.chunks(32)))
        .enumerate()
    {
        let bound = amax / 254.0 + amax / 2048.0;
        for (a, b) in g.iter().zip(w) {
            assert!((a - b).abs() <= bound, "{name} block {k}: {a} vs {b}");
        }
    }
}

/// Asserts F16's bound: every value within half an f16 ulp of the one it
/// was made from (2^-11 relative; the values are normal f16 numbers).
pub fn assert_within_f16(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}");
    for (a, b) in got.iter().zip(want) {
        assert!((a - b).abs() <= b.abs() / 2048.0, "{name}: {a} vs {b}");
    }
}

/// Asserts `got` equals `want` bit for bit.
pub fn assert_same_bits(name: &str, got: &[f32], want: &[f32]) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(got), bits(want), "{name}");
}

/// Each GGUF tensor of `pairs` (GGUF name, checkpoint name) is of type `ty`
/// in `f` and within that type's bound of the checkpoint tensor it was made
/// from, decoded: Q8_0's ([`assert_within_q8_0`]), F16's
/// ([`assert_within_f16`]), or F32 bit for bit.
pub fn assert_converted(f: &GgufFile, ck: &Checkpoint, ty: GgmlType, pairs: &[(&str, &str)]) {
    for &(gguf, src) in pairs {
        assert_eq!(tensor(f, gguf).0, ty, "{gguf}");
        let want = Weight::open(ck, src).unwrap().to_f32();
        let got = dequantize(f, gguf);
        match ty {
            GgmlType::Q8_0 => assert_within_q8_0(gguf, &got, &want),
            GgmlType::F16 => assert_within_f16(gguf, &got, &want),
            GgmlType::F32 => assert_same_bits(gguf, &got, &want),
            other => panic!("{gguf}: no bound for {other}"),
        }
    }
}

/// Asserts that every routed-expert tensor of the `n_layer` layers of `f`
/// (gate, up, down) is MXFP4 and decodes, expert by expert, to exactly the
/// checkpoint's FP4 values (E2M1's −0 reads as +0 in MXFP4: values are
/// compared, not bits). Returns the experts compared.
pub fn assert_fp4_experts_exact(
    f: &GgufFile,
    ck: &Checkpoint,
    n_layer: usize,
    n_expert: usize,
) -> usize {
    let mut n = 0;
    for l in 0..n_layer {
        for (gguf, w) in [("gate", "w1"), ("up", "w3"), ("down", "w2")] {
            let name = format!("blk.{l}.ffn_{gguf}_exps.weight");
            assert_eq!(tensor(f, &name).0, GgmlType::Mxfp4, "{name}");
            let got = dequantize(f, &name);
            let slab = got.len() / n_expert;
            for x in 0..n_expert {
                let src = format!("layers.{l}.ffn.experts.{x}.{w}.weight");
                let want = Weight::open(ck, &src).unwrap();
                assert!(want.is_fp4(), "{src}");
                let want = want.to_f32();
                let g = &got[x * slab..(x + 1) * slab];
                assert!(
                    g.iter().zip(&want).all(|(a, b)| a == b),
                    "{name} expert {x}"
                );
                n += 1;
            }
        }
    }
    n
}

/// The logits after each of `ids` on the cpu-ref backend (plain numerics,
/// context 256), for a model file of either family.
pub fn cpu_ref_logits(path: &Path, ids: &[u32]) -> Vec<Vec<f32>> {
    let m = AnyModel::open(path).unwrap();
    let opts = SessionOptions {
        ctx: 256,
        numerics: Numerics::Plain,
        backend: BackendKind::CpuRef,
        ..Default::default()
    };
    let mut sess = Session::open_any(&m, opts).unwrap();
    ids.iter()
        .map(|&t| {
            sess.eval(t).unwrap();
            sess.logits().to_vec()
        })
        .collect()
}

/// The largest max|Δlogit| of a step of `got` against `want`, relative to
/// that step's largest |logit| of `want`; asserts `vocab` finite logits a
/// step (`what` names the run).
pub fn worst_relative_logit_diff(
    what: &str,
    got: &[Vec<f32>],
    want: &[Vec<f32>],
    vocab: usize,
) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}");
    let mut worst = 0f32;
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), vocab, "{what}");
        assert!(g.iter().all(|x| x.is_finite()), "{what}: non-finite logits");
        let scale = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        worst = worst.max(super::max_abs_diff(g, w) / scale);
    }
    eprintln!("{what}: worst max|Δlogit| / max|logit| = {worst:.3e}");
    worst
}

/// The draft model's first-row logits after `ids` and `next` (cpu-ref,
/// plain numerics, context 256): `model` has its drafter file (MTP or
/// DSpark, `drafter`) attached.
pub fn draft_logits(model: AnyModel, drafter: DraftModel, ids: &[u32], next: u32) -> Vec<f32> {
    let opts = SessionOptions {
        ctx: 256,
        numerics: Numerics::Plain,
        backend: BackendKind::CpuRef,
        drafter,
        ..Default::default()
    };
    let mut sess = Session::open_any(&model, opts).unwrap();
    for &t in ids {
        sess.eval(t).unwrap();
    }
    sess.draft_logits(next).unwrap()
}

/// `ds4 -m main` greedy on a repetitive prompt for `n` tokens, plain and
/// with `--dspark --mtp-model drafter --draft 4 --draft-fixed`: both
/// succeed, the drafter ran, and the text is the same (drafts are
/// verified, so any drafter gives plain decoding's text). Returns the
/// drafted run's last stderr line (its speculation figures).
pub fn assert_dspark_prints_plain(main: &Path, drafter: &Path, n: &str) -> String {
    let base = [
        "-m",
        s(main),
        "-p",
        "the cat sat on the mat, the cat sat on the mat, the cat",
        "-n",
        n,
        "--temp",
        "0",
        "--nothink",
        "--cpu",
    ];
    let plain = super::process::ds4(&base);
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let mut args = base.to_vec();
    args.extend([
        "--dspark",
        "--mtp-model",
        s(drafter),
        "--draft",
        "4",
        "--draft-fixed",
    ]);
    let o = super::process::ds4(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && err.contains("speculation (dspark):"),
        "{err}"
    );
    assert!(!plain.stdout.is_empty());
    assert_eq!(o.stdout, plain.stdout);
    err.lines().last().unwrap_or_default().to_string()
}

/// gguf-py's reading of the GGUF at `path` (tools/gguf_tensor_digest.py:
/// `GGUFReader` and `gguf.quants.dequantize`) equals ds4's: the metadata
/// keys and their value types in order, and every tensor's name, shape and
/// type in order and its decoded values (sha256 of the f32 bytes; tables
/// as their integers). Returns false, saying why, where gguf-py is not
/// installed (`.ci/run` installs it).
pub fn assert_gguf_py_reads_the_same(path: &Path) -> bool {
    use ds4::gguf::MetaValue;
    use sha2::{Digest, Sha256};
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/gguf_tensor_digest.py");
    let o = Command::new("python3")
        .arg(script)
        .arg(path)
        .output()
        .expect("python3 runs");
    if o.status.code() == Some(3) {
        eprintln!("skipped: {}", String::from_utf8_lossy(&o.stderr).trim());
        return false;
    }
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let py: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let f = GgufFile::open(path).unwrap();
    let keys: Vec<serde_json::Value> = f
        .metadata()
        .map(|(k, v)| {
            let ty = match v {
                MetaValue::U8(_) => "UINT8",
                MetaValue::I8(_) => "INT8",
                MetaValue::U16(_) => "UINT16",
                MetaValue::I16(_) => "INT16",
                MetaValue::U32(_) => "UINT32",
                MetaValue::I32(_) => "INT32",
                MetaValue::F32(_) => "FLOAT32",
                MetaValue::Bool(_) => "BOOL",
                MetaValue::String(_) => "STRING",
                MetaValue::Array(_) => "ARRAY",
                MetaValue::U64(_) => "UINT64",
                MetaValue::I64(_) => "INT64",
                MetaValue::F64(_) => "FLOAT64",
            };
            serde_json::json!([k, ty])
        })
        .collect();
    assert_eq!(
        py["keys"].as_array().unwrap(),
        &keys,
        "{}: keys",
        path.display()
    );
    let py_tensors = py["tensors"].as_array().unwrap();
    assert_eq!(
        py_tensors.len(),
        f.tensor_infos().len(),
        "{}",
        path.display()
    );
    for (info, pt) in f.tensor_infos().iter().zip(py_tensors) {
        let (ty, _, data) = tensor(&f, &info.name);
        let values: Vec<f32> = match ty {
            GgmlType::I32 => data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
                .collect(),
            GgmlType::I8 => data.iter().map(|&b| b as i8 as f32).collect(),
            _ => dequantize(&f, &info.name),
        };
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let sha: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let what = format!("{}: {}", path.display(), info.name);
        assert_eq!(pt["name"], info.name.as_str(), "{what}");
        assert_eq!(pt["ne"], serde_json::json!(info.ne), "{what}: shape");
        assert_eq!(
            pt["type"].as_str().unwrap(),
            ty.to_string().to_uppercase(),
            "{what}: type"
        );
        assert_eq!(
            pt["f32_sha256"].as_str().unwrap(),
            sha,
            "{what}: decoded values"
        );
    }
    true
}
