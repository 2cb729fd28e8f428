//! `ds4-quantize --compare` and `--splice` on the generated tiny models.

mod common;

use common::quantize::{quantize_tool, s};
use common::{fresh_dir, tiny_model_path};
use ds4::convert::compare::compare;
use ds4::gguf::GgufFile;
use ds4::model::ModelFile;
use ds4::quant::{self, GgmlType};
use ds4::testmodel::Variant;

#[test]
fn compare_with_itself_is_all_zero() {
    let p = tiny_model_path(Variant::Q8);
    let f = GgufFile::open(&p).unwrap();
    let (diffs, other) = compare(&f, &f).unwrap();
    assert!(other.is_empty(), "{other:?}");
    assert_eq!(diffs.len(), f.tensor_infos().len());
    for d in &diffs {
        assert_eq!((d.rmse, d.max_err), (0.0, 0.0), "{}", d.name);
    }
    assert!(diffs.iter().any(|d| d.rms_a > 0.0));
    let out = quantize_tool(&["--compare", s(&p), s(&p)]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let n = diffs.len();
    assert!(
        text.contains(&format!("{n} tensors compared, {n} identical")),
        "{text}"
    );
}

/// Q8_0 rounds each value to a step of its block's scale d = max |x| / 127
/// (half a step: max |x| / 254) and keeps d as f16 (relative error 2^-11,
/// times at most 127 steps: max |x| / 2048); F16 at most 2^-11 relative.
#[test]
fn compare_q8_with_f32_is_within_the_quant_error() {
    let (pa, pb) = (tiny_model_path(Variant::F32), tiny_model_path(Variant::Q8));
    let (a, b) = (GgufFile::open(&pa).unwrap(), GgufFile::open(&pb).unwrap());
    let (diffs, other) = compare(&a, &b).unwrap();
    assert!(other.is_empty(), "{other:?}");
    let mut quantized = 0;
    for d in &diffs {
        if d.ty_a != GgmlType::F32 {
            // Integer tables are kept as they are.
            assert_eq!(d.ty_a, d.ty_b, "{}", d.name);
            assert_eq!(d.max_err, 0.0, "{}", d.name);
            continue;
        }
        let t = a.tensor(&d.name).unwrap().unwrap();
        let mut row = vec![0f32; t.ne[0] as usize];
        let mut amax = 0f32;
        for r in 0..t.n_rows() as usize {
            quant::dequantize_row(t.ty, t.row(r).unwrap(), &mut row).unwrap();
            amax = row.iter().fold(amax, |m, v| m.max(v.abs()));
        }
        let bound = match d.ty_b {
            GgmlType::F32 => 0.0,
            GgmlType::F16 => amax as f64 / 2048.0,
            GgmlType::Q8_0 => amax as f64 * (1.0 / 254.0 + 1.0 / 2048.0),
            ty => panic!("{}: unexpected type {ty:?}", d.name),
        };
        assert!(
            d.max_err <= bound,
            "{} ({:?}): max error {} above {bound}",
            d.name,
            d.ty_b,
            d.max_err
        );
        assert!(d.rmse <= d.max_err);
        if d.ty_b == GgmlType::Q8_0 {
            quantized += 1;
            assert!(d.rmse > 0.0, "{}", d.name);
            assert!(d.rmse < d.rms_a / 100.0, "{}: rmse {}", d.name, d.rmse);
        }
    }
    assert!(quantized > 0);
}

#[test]
fn splice_takes_the_matching_tensors_byte_for_byte() {
    let (pa, pb) = (tiny_model_path(Variant::Q8), tiny_model_path(Variant::Q2));
    let dir = fresh_dir("gguf_tools", "splice");
    let out = dir.join("mixed.gguf");
    let pattern = "blk.*.ffn_down_exps.weight";
    let r = quantize_tool(&[
        "--splice",
        s(&pa),
        s(&pb),
        "--take",
        pattern,
        "-o",
        s(&out),
        "--quiet",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    ModelFile::open(&out).unwrap();
    let (a, b, m) = (
        GgufFile::open(&pa).unwrap(),
        GgufFile::open(&pb).unwrap(),
        GgufFile::open(&out).unwrap(),
    );
    assert_eq!(m.tensor_infos().len(), a.tensor_infos().len());
    assert_eq!(m.metadata().count(), a.metadata().count());
    let mut taken = 0;
    for info in m.tensor_infos() {
        let from_b = ds4::convert::output::glob(pattern, &info.name);
        let src = if from_b { &b } else { &a };
        let (t, u) = (
            m.tensor(&info.name).unwrap().unwrap(),
            src.tensor(&info.name).unwrap().unwrap(),
        );
        assert_eq!((t.ty, t.ne), (u.ty, u.ne), "{}", info.name);
        assert!(t.data == u.data, "{} differs from its source", info.name);
        taken += from_b as usize;
    }
    assert!(taken > 0);
    // The Q2 file's experts differ in type from the Q8 ones, so the splice
    // changed something.
    let t = m.tensor("blk.0.ffn_down_exps.weight").unwrap().unwrap();
    assert_ne!(
        t.ty,
        a.tensor("blk.0.ffn_down_exps.weight").unwrap().unwrap().ty
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}

#[test]
fn bad_inputs_give_clear_errors_and_no_output() {
    let dir = fresh_dir("gguf_tools", "bad");
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"not a gguf file at all").unwrap();
    let good = tiny_model_path(Variant::Q8);
    let out = dir.join("out.gguf");

    let r = quantize_tool(&["--compare", s(&junk), s(&good)]);
    assert!(!r.status.success());
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(e.contains("junk.gguf") && !e.contains("panicked"), "{e}");

    let missing = dir.join("missing.gguf");
    let r = quantize_tool(&["--compare", s(&good), s(&missing)]);
    assert!(!r.status.success());
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(e.contains("missing.gguf") && !e.contains("panicked"), "{e}");

    // A pattern that matches nothing, and a file of another model.
    let r = quantize_tool(&[
        "--splice",
        s(&good),
        s(&good),
        "--take",
        "nothing.*",
        "-o",
        s(&out),
    ]);
    assert!(!r.status.success());
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(
        e.contains("matches no tensor") && !e.contains("panicked"),
        "{e}"
    );
    let r = quantize_tool(&["--splice", s(&good), s(&junk), "--take", "*", "-o", s(&out)]);
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("junk.gguf"));
    let v41 = common::v41_model_path();
    let r = quantize_tool(&["--splice", s(&good), s(&v41), "--take", "*", "-o", s(&out)]);
    assert!(!r.status.success());
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(
        (e.contains("same model") || e.contains("shape")) && !e.contains("panicked"),
        "{e}"
    );

    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "leftovers");
}
