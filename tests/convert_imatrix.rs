//! Importance matrices (`ds4::convert::imatrix`, `ds4-quantize --imatrix`,
//! issue 37): llama.cpp's GGUF imatrix written and read back, with
//! llama.cpp's key names, types and tensor shapes (and, where gguf-py is
//! installed, read and written by gguf-py too); on the script's `--tame`
//! tiny V4 checkpoint, a synthetic imatrix of very uneven column weights
//! lowers the importance-weighted error of the q4 (Q4_K, through the
//! command) and q2 (IQ2_XXS and Q2_K, one layer through the converter's
//! per-tensor path) routed experts; an imatrix of another model exits 1
//! naming the imatrix and the tensor, leaving no output.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::checkpoint::make_checkpoint;
use common::fresh_dir;
use common::quantize::{convert, quantize_tool, s};
use common::rng::Normal;
use ds4::convert::decode::Weight;
use ds4::convert::imatrix::{self, Entry, Format, Imatrix};
use ds4::convert::layout::Layout;
use ds4::convert::recipe::Recipe;
use ds4::convert::safetensors::Checkpoint;
use ds4::convert::write;
use ds4::gguf::{GgufFile, MetaArray, MetaValue};
use ds4::quant::{self, GgmlType};
use ds4::testmodel::Variant;

const VOCAB: &str = "512";

/// The script's `--tame` tiny V4 checkpoint (values of a well-conditioned
/// model: a quantizer's error is meaningful on them), written once.
fn checkpoint() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = fresh_dir("convert_imatrix", "checkpoint");
        make_checkpoint(&dir, &["--model", "v4", "--vocab", VOCAB, "--tame"]);
        dir
    })
}

fn is_experts(name: &str) -> bool {
    name.ends_with("_exps.weight")
}

/// The one routed-expert tensor the synthetic imatrix leaves out (it must
/// be quantized without, with a warning).
const LEFT_OUT: &str = "blk.5.ffn_up_exps.weight";

/// A synthetic imatrix for every routed-expert tensor of `layout` but
/// [`LEFT_OUT`]: per expert, column weights spread log-uniformly over six
/// decades (`10^(6u − 3)`), stored as llama-imatrix stores them (sums of
/// `count` rows, count `16 + e`).
fn synthetic(layout: &Layout) -> Imatrix {
    let mut entries = BTreeMap::new();
    for t in layout.tensors.iter().filter(|t| is_experts(&t.name)) {
        if t.name == LEFT_OUT {
            continue;
        }
        let (ne0, n_mat) = imatrix::tensor_matrices(&t.ne);
        let mut rng = Normal::for_name(37, &t.name);
        let counts: Vec<f32> = (0..n_mat).map(|e| 16.0 + e as f32).collect();
        let mut sums = Vec::with_capacity(ne0 * n_mat);
        for &c in &counts {
            for _ in 0..ne0 {
                sums.push(c * 10f32.powf(6.0 * rng.uniform() as f32 - 3.0));
            }
        }
        entries.insert(t.name.clone(), Entry::new(ne0, sums, counts));
    }
    Imatrix {
        format: Format::Gguf,
        datasets: vec!["synthetic-uneven".into()],
        chunk_count: 3,
        chunk_size: 512,
        entries,
    }
}

/// Σ_rows Σ_j w_j (q_j − x_j)² of one routed-expert tensor: `x` the
/// checkpoint's decoded values, `q` the quantized bytes decoded with the
/// crate's `dequantize_row`, `w` expert e's importance from `weights`.
fn weighted_error(
    ck: &Checkpoint,
    layout: &Layout,
    name: &str,
    ty: GgmlType,
    bytes: &[u8],
    weights: &Entry,
) -> f64 {
    let t = layout.get(name).unwrap();
    let (ne0, n_mat) = imatrix::tensor_matrices(&t.ne);
    let rb = ty.row_bytes(ne0 as u64).unwrap() as usize;
    let mut q = vec![0f32; ne0];
    let mut err = 0f64;
    let mut row = 0usize;
    for (e, (src, _)) in t.sources().iter().enumerate() {
        assert!(e < n_mat);
        let w = Weight::open(ck, src).unwrap();
        let mut x = vec![0f32; w.rows * w.cols];
        w.rows_f32(0, &mut x);
        let imp = weights.importance(ne0, e);
        for xr in x.chunks_exact(ne0) {
            quant::dequantize_row(ty, &bytes[row * rb..(row + 1) * rb], &mut q).unwrap();
            err += xr
                .iter()
                .zip(&q)
                .zip(&imp)
                .map(|((&x, &q), &w)| w as f64 * ((q - x) as f64).powi(2))
                .sum::<f64>();
            row += 1;
        }
    }
    assert_eq!(row * rb, bytes.len());
    err
}

/// The bytes of tensor `name` of `f`, with its type.
fn tensor_bytes<'a>(f: &'a GgufFile, name: &str) -> (GgmlType, &'a [u8]) {
    let v = f.tensor(name).unwrap().unwrap();
    (v.ty, v.data)
}

#[test]
fn written_and_read_back_with_llama_cpp_names_and_shapes() {
    let dir = fresh_dir("convert_imatrix", "round-trip");
    let mut entries = BTreeMap::new();
    entries.insert(
        "blk.3.ffn_down_exps.weight".to_string(),
        Entry::new(
            6,
            (0..24).map(|i| i as f32 * 0.5).collect(),
            vec![3.0, 0.0, 5.0, 7.0],
        ),
    );
    entries.insert(
        "blk.0.attn_q_a.weight".to_string(),
        Entry::new(5, vec![1.0, 2.0, 3.0, 4.0, 5.0], vec![2.0]),
    );
    let m = Imatrix {
        format: Format::Gguf,
        datasets: vec!["a.txt".into(), "b.txt".into()],
        chunk_count: 12,
        chunk_size: 4096,
        entries,
    };
    let path = dir.join("imatrix.gguf");
    m.write(&path).unwrap();
    assert_eq!(Imatrix::read(&path).unwrap(), m);

    // The file as llama.cpp writes it (tools/imatrix/imatrix.cpp,
    // IMatrixCollector::save_imatrix; read by tools/quantize/quantize.cpp,
    // load_imatrix; key names as gguf-py's constants.py Keys.IMatrix and
    // GGUFType.IMATRIX): `general.type` "imatrix" (string),
    // `imatrix.datasets` (array of strings), `imatrix.chunk_count` and
    // `imatrix.chunk_size` (u32, gguf_set_val_u32); per entry in name order
    // NAME.in_sum2 F32 [n_cols, n_mat] then NAME.counts F32 [1, n_mat].
    let f = GgufFile::open(&path).unwrap();
    let kv: Vec<(&str, &MetaValue)> = f.metadata().collect();
    assert_eq!(
        kv,
        vec![
            ("general.type", &MetaValue::String("imatrix".into())),
            (
                "imatrix.datasets",
                &MetaValue::Array(MetaArray::String(vec!["a.txt".into(), "b.txt".into()]))
            ),
            ("imatrix.chunk_count", &MetaValue::U32(12)),
            ("imatrix.chunk_size", &MetaValue::U32(4096)),
        ]
    );
    let dir_: Vec<(String, Vec<u64>, Option<GgmlType>)> = f
        .tensor_infos()
        .iter()
        .map(|i| (i.name.clone(), i.ne.clone(), i.ty))
        .collect();
    let f32_ = Some(GgmlType::F32);
    assert_eq!(
        dir_,
        vec![
            ("blk.0.attn_q_a.weight.in_sum2".into(), vec![5, 1], f32_),
            ("blk.0.attn_q_a.weight.counts".into(), vec![1, 1], f32_),
            (
                "blk.3.ffn_down_exps.weight.in_sum2".into(),
                vec![6, 4],
                f32_
            ),
            ("blk.3.ffn_down_exps.weight.counts".into(), vec![1, 4], f32_),
        ]
    );
    // Matrix e is in_sum2[:, e] / counts[e]; all ones without data.
    let e = m.get("blk.3.ffn_down_exps.weight").unwrap();
    assert_eq!(
        e.importance(6, 0),
        vec![0.0, 0.5 / 3.0, 1.0 / 3.0, 0.5, 2.0 / 3.0, 2.5 / 3.0]
    );
    assert_eq!(e.importance(6, 1), vec![1.0; 6]);

    // --imatrix-stats lists the entries.
    let o = quantize_tool(&["--imatrix-stats", s(&path)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("2 entries, 12 chunks of 4096 tokens"), "{out}");
    assert!(out.contains("blk.3.ffn_down_exps.weight"), "{out}");
    assert!(out.lines().count() == 4, "{out}");

    // The legacy (.dat) format: read only.
    let mut b = Vec::new();
    b.extend(1i32.to_le_bytes());
    let name = "blk.0.attn_q_a.weight";
    b.extend((name.len() as i32).to_le_bytes());
    b.extend(name.as_bytes());
    b.extend(4i32.to_le_bytes()); // ncall
    b.extend(3i32.to_le_bytes()); // values
    for v in [4.0f32, 8.0, 2.0] {
        b.extend(v.to_le_bytes());
    }
    b.extend(9i32.to_le_bytes());
    b.extend(8i32.to_le_bytes());
    b.extend(b"wiki.txt");
    let dat = dir.join("imatrix.dat");
    std::fs::write(&dat, &b).unwrap();
    let l = Imatrix::read(&dat).unwrap();
    assert_eq!(l.format, Format::Legacy);
    assert_eq!(
        (l.chunk_count, l.datasets.clone()),
        (9, vec!["wiki.txt".to_string()])
    );
    assert_eq!(l.get(name).unwrap().importance(3, 0), vec![1.0, 2.0, 0.5]);
}

/// Runs tools/imatrix_gguf.py; `None` (the test skips, saying why) when
/// gguf-py is not installed.
fn gguf_py(args: &[&str]) -> Option<Output> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/imatrix_gguf.py");
    let o = Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs");
    if o.status.code() == Some(3) {
        eprintln!(
            "skipped: {} (the check against gguf-py needs it)",
            String::from_utf8_lossy(&o.stderr).trim()
        );
        return None;
    }
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    Some(o)
}

#[test]
fn gguf_py_reads_ours_and_we_read_gguf_pys() {
    let dir = fresh_dir("convert_imatrix", "gguf-py");
    let theirs = dir.join("theirs.gguf");
    let Some(_) = gguf_py(&[
        "write",
        s(&theirs),
        "--entry",
        "blk.1.ffn_gate_exps.weight:256:8",
        "--entry",
        "blk.0.attn_kv.weight:256:1",
        "--empty",
        "blk.1.ffn_gate_exps.weight:5",
        "--dataset",
        "calibration.txt",
        "--chunk-count",
        "40",
        "--chunk-size",
        "512",
    ]) else {
        return;
    };
    let m = Imatrix::read(&theirs).unwrap();
    assert_eq!(m.format, Format::Gguf);
    assert_eq!(m.datasets, vec!["calibration.txt".to_string()]);
    assert_eq!((m.chunk_count, m.chunk_size), (40, 512));
    assert_eq!(m.entries.len(), 2);
    // The script's formula: in_sum2[m][j] = (j % 11) + 0.5 m + 0.125,
    // counts[m] = 4 (m + 1), 0 for --empty.
    let e = m.get("blk.1.ffn_gate_exps.weight").unwrap();
    assert_eq!((e.n_cols, e.n_mat()), (256, 8));
    for mat in 0..8 {
        let count = if mat == 5 {
            0.0
        } else {
            4.0 * (mat + 1) as f32
        };
        assert_eq!(e.counts[mat], count);
        for j in 0..256 {
            let sum = (j % 11) as f32 + 0.5 * mat as f32 + 0.125;
            assert_eq!(e.in_sum2[mat * 256 + j], sum);
        }
    }
    assert_eq!(e.importance(256, 5), vec![1.0; 256]);
    assert_eq!(m.get("blk.0.attn_kv.weight").unwrap().counts, vec![4.0]);

    // Ours, read by gguf-py: the same names, value types and shapes.
    let ours = dir.join("ours.gguf");
    m.write(&ours).unwrap();
    let dump = gguf_py(&["dump", s(&ours)]).unwrap();
    let j: serde_json::Value = serde_json::from_slice(&dump.stdout).unwrap();
    let types = |k: &str| j["kv"][k]["types"].clone();
    assert_eq!(types("general.type"), serde_json::json!(["STRING"]));
    assert_eq!(j["kv"]["general.type"]["value"], "imatrix");
    assert_eq!(
        types("imatrix.datasets"),
        serde_json::json!(["ARRAY", "STRING"])
    );
    assert_eq!(
        j["kv"]["imatrix.datasets"]["value"],
        serde_json::json!(["calibration.txt"])
    );
    assert_eq!(types("imatrix.chunk_count"), serde_json::json!(["UINT32"]));
    assert_eq!(types("imatrix.chunk_size"), serde_json::json!(["UINT32"]));
    assert_eq!(j["kv"].as_object().unwrap().len(), 4);
    let t = j["tensors"].as_array().unwrap();
    let dir_: Vec<(String, serde_json::Value, String)> = t
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["ne"].clone(),
                t["type"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let row = |n: &str, ne: serde_json::Value| (n.to_string(), ne, "F32".to_string());
    assert_eq!(
        dir_,
        vec![
            row("blk.0.attn_kv.weight.in_sum2", serde_json::json!([256, 1])),
            row("blk.0.attn_kv.weight.counts", serde_json::json!([1, 1])),
            row(
                "blk.1.ffn_gate_exps.weight.in_sum2",
                serde_json::json!([256, 8])
            ),
            row(
                "blk.1.ffn_gate_exps.weight.counts",
                serde_json::json!([1, 8])
            ),
        ]
    );
    let data: Vec<f32> = t[2]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(data, e.in_sum2);
}

#[test]
fn q4_with_an_uneven_imatrix_has_lower_weighted_error() {
    let ckdir = checkpoint();
    let ck = Checkpoint::open(ckdir).unwrap();
    let layout = Layout::for_checkpoint(&ck).unwrap();
    let im = synthetic(&layout);
    let dir = fresh_dir("convert_imatrix", "q4");
    let imf = dir.join("uneven.imatrix.gguf");
    im.write(&imf).unwrap();
    let with = dir.join("with.gguf");
    let without = dir.join("without.gguf");
    let o = convert(ckdir, "q4", &["--imatrix", s(&imf)], &with);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    // The tensor without an entry: a warning naming it, quantized without.
    assert!(err.contains(LEFT_OUT) && err.contains("warning"), "{err}");
    assert_eq!(err.matches("warning").count(), 1, "{err}");
    let o = convert(ckdir, "q4", &[], &without);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let fw = GgufFile::open(&with).unwrap();
    let fo = GgufFile::open(&without).unwrap();
    // llama-quantize's keys (tools/quantize/quantize.cpp, main; written as
    // u32 by src/llama-quant.cpp, llama_model_quantize_impl).
    assert_eq!(fw.get_str("quantize.imatrix.file"), Some(s(&imf)));
    assert_eq!(
        fw.get_str("quantize.imatrix.dataset"),
        Some("synthetic-uneven")
    );
    assert_eq!(
        fw.get("quantize.imatrix.entries_count"),
        Some(&MetaValue::U32(im.entries.len() as u32))
    );
    assert_eq!(
        fw.get("quantize.imatrix.chunks_count"),
        Some(&MetaValue::U32(3))
    );
    assert!(fo.get("quantize.imatrix.file").is_none());
    assert_eq!(fw.metadata().count(), fo.metadata().count() + 4);

    let (mut tw, mut to) = (0f64, 0f64);
    for t in layout.tensors.iter() {
        let (ty, bw) = tensor_bytes(&fw, &t.name);
        let (ty_o, bo) = tensor_bytes(&fo, &t.name);
        assert_eq!(ty, ty_o);
        let Some(entry) = im.get(&t.name) else {
            // No entry (LEFT_OUT, and every non-expert tensor): the same bytes.
            assert!(bw == bo, "{} differs without an imatrix entry", t.name);
            continue;
        };
        assert_eq!(ty, GgmlType::Q4K, "{}", t.name);
        let ew = weighted_error(&ck, &layout, &t.name, ty, bw, entry);
        let eo = weighted_error(&ck, &layout, &t.name, ty, bo, entry);
        eprintln!(
            "{:<28} Q4_K weighted error: with imatrix {ew:.6e}, without {eo:.6e}",
            t.name
        );
        assert!(ew < eo, "{}: with {ew} ≥ without {eo}", t.name);
        tw += ew;
        to += eo;
    }
    eprintln!(
        "q4 routed experts, weighted error: with imatrix {tw:.6e}, without {to:.6e} ({:.1} %)",
        100.0 * tw / to
    );
    assert!(tw < to);
}

#[test]
fn q2_with_an_uneven_imatrix_has_lower_weighted_error() {
    // One layer's IQ2_XXS gate and Q2_K down (IQ2_XXS's search is slow:
    // the whole q2 conversion twice would take half a minute), through the
    // converter's own per-tensor path.
    let ck = Checkpoint::open(checkpoint()).unwrap();
    let layout = Layout::for_checkpoint(&ck).unwrap();
    let im = synthetic(&layout);
    let types = Recipe::named(Variant::Q2).types(&layout).unwrap();
    for name in ["blk.1.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight"] {
        let k = layout.tensors.iter().position(|t| t.name == name).unwrap();
        let ty = types[k];
        let entry = im.get(name).unwrap();
        let bw = write::convert_tensor(&ck, &layout, name, ty, Some(entry)).unwrap();
        let bo = write::convert_tensor(&ck, &layout, name, ty, None).unwrap();
        let ew = weighted_error(&ck, &layout, name, ty, &bw, entry);
        let eo = weighted_error(&ck, &layout, name, ty, &bo, entry);
        eprintln!(
            "{name:<28} {ty} weighted error: with imatrix {ew:.6e}, without {eo:.6e} ({:.1} %)",
            100.0 * ew / eo
        );
        assert!(ew < eo, "{name} {ty}: with {ew} ≥ without {eo}");
    }
    assert_eq!(
        types[layout
            .tensors
            .iter()
            .position(|t| t.name == "blk.1.ffn_gate_exps.weight")
            .unwrap()],
        GgmlType::Iq2Xxs
    );
    assert_eq!(
        types[layout
            .tensors
            .iter()
            .position(|t| t.name == "blk.1.ffn_down_exps.weight")
            .unwrap()],
        GgmlType::Q2K
    );
}

/// Runs a q4 conversion with `imatrix`; it must exit 1 naming `imf` and
/// `tensor`, and leave the output folder empty.
fn refused(case: &str, im: &Imatrix, tensor: &str, also: &str) {
    let dir = fresh_dir("convert_imatrix", &format!("bad-{case}"));
    let imf = fresh_dir("convert_imatrix", &format!("bad-{case}-in")).join("other.imatrix");
    im.write(&imf).unwrap();
    let out = dir.join("x.gguf");
    let o = convert(checkpoint(), "q4", &["--imatrix", s(&imf)], &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{case}: {err}");
    assert!(err.contains(s(&imf)), "{case}: {err}");
    assert!(err.contains(tensor), "{case}: {err}");
    assert!(err.contains(also), "{case}: {err}");
    assert!(!err.contains("panicked"), "{case}: {err}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "{case}");
}

#[test]
fn an_imatrix_of_another_model_exits_1_and_leaves_no_output() {
    let ck = Checkpoint::open(checkpoint()).unwrap();
    let layout = Layout::for_checkpoint(&ck).unwrap();
    let good = synthetic(&layout);
    let e = |cols: usize, mats: usize| Entry::new(cols, vec![1.0; cols * mats], vec![4.0; mats]);

    // A tensor the model does not have (a seventh layer).
    let mut im = good.clone();
    im.entries
        .insert("blk.6.ffn_down_exps.weight".into(), e(256, 8));
    refused(
        "unknown",
        &im,
        "blk.6.ffn_down_exps.weight",
        "another model",
    );

    // Another column count (ne0 256).
    let mut im = good.clone();
    im.entries
        .insert("blk.2.ffn_down_exps.weight".into(), e(512, 8));
    refused("columns", &im, "blk.2.ffn_down_exps.weight", "512");

    // Another expert count (8).
    let mut im = good.clone();
    im.entries
        .insert("blk.0.ffn_gate_exps.weight".into(), e(256, 16));
    refused("experts", &im, "blk.0.ffn_gate_exps.weight", "16");

    // A dense tensor of another width, even one the recipe does not
    // weigh (Q8_0): the imatrix is of another model all the same.
    let mut im = good.clone();
    im.entries
        .insert("blk.0.attn_q_a.weight".into(), e(1024, 1));
    refused("dense", &im, "blk.0.attn_q_a.weight", "1024");

    // Not an imatrix at all.
    let dir = fresh_dir("convert_imatrix", "bad-not-imatrix");
    let junk = dir.join("junk.dat");
    std::fs::write(&junk, b"this is not an importance matrix").unwrap();
    let out = dir.join("x.gguf");
    let o = convert(checkpoint(), "q2", &["--imatrix", s(&junk)], &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(s(&junk)) && err.contains("legacy"), "{err}");
    assert!(!out.exists());
}

#[test]
fn an_imatrix_with_a_recipe_that_does_not_use_one_is_ignored() {
    let ck = Checkpoint::open(checkpoint()).unwrap();
    let layout = Layout::for_checkpoint(&ck).unwrap();
    let dir = fresh_dir("convert_imatrix", "q8");
    let imf = dir.join("uneven.imatrix.gguf");
    synthetic(&layout).write(&imf).unwrap();
    let out = dir.join("q8.gguf");
    let o = convert(checkpoint(), "q8", &["--imatrix", s(&imf)], &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("ignored"), "{err}");
    let f = GgufFile::open(&out).unwrap();
    assert!(f.get("quantize.imatrix.file").is_none());
}
