//! DeepSeek's DSpark drafter converted from the official checkpoint
//! (`ds4-quantize --hf DIR --dspark-only --recipe R -o OUT`,
//! `ds4::convert::dspark`, issue 37) on the tiny checkpoint of
//! `tools/checkpoint/make_checkpoint.py --model v4 --dspark --vocab 512`
//! (the main model, and the drafter's two stages under `mtp.{k}.*` with the
//! `dspark_*` keys of `config.json`): every recipe's drafter file has, name by
//! name, the directory and the `dspark.*` keys of the test-model generator's
//! drafter file; the f32 recipe holds the checkpoint's values exactly; the
//! main map and the drafter's read every checkpoint tensor exactly once;
//! ds4's loader attaches the drafter to the converted main file and `ds4
//! --dspark` prints plain decoding's text with it; the q8 drafter's logits
//! agree with the f32 one's; a missing drafter tensor, a config without the
//! drafter's keys or with a value the loader refuses exits 1 naming the file
//! and the tensor or key, and leaves nothing under the output name.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use common::checkpoint::make_checkpoint;
use common::fresh_dir;
use common::quantize::{assert_dspark_prints_plain, convert, draft_logits, quantize_tool, s};
use ds4::convert::decode::{scale_name, Weight};
use ds4::convert::dspark::DsparkMeta;
use ds4::convert::layout::Layout;
use ds4::convert::metadata::{V41Meta, V4Config};
use ds4::convert::safetensors::{Checkpoint, CONFIG_FILE, INDEX_FILE};
use ds4::gguf::GgufFile;
use ds4::model::v41::V41ModelFile;
use ds4::model::{AnyModel, Arch, ModelFile};
use ds4::quant::{self, GgmlType};
use ds4::session::DraftModel;
use ds4::testmodel::dspark::{write_dspark, write_v41_dspark, DsparkSpec};
use ds4::testmodel::v41::V41Spec;
use ds4::testmodel::{TestModelSpec, Variant};

const VOCAB: usize = 512;

/// The script's tiny V4 checkpoint with the DSpark drafter, written once
/// for the whole file: random bytes, or with `tame` a well-conditioned
/// model's values (for the forward passes).
fn checkpoint(tame: bool) -> &'static Path {
    static DIRS: [OnceLock<PathBuf>; 2] = [OnceLock::new(), OnceLock::new()];
    DIRS[tame as usize].get_or_init(|| {
        let dir = fresh_dir("convert_dspark", &format!("checkpoint-tame-{tame}"));
        let vocab = VOCAB.to_string();
        let mut args = vec!["--model", "v4", "--dspark", "--vocab", &vocab];
        if tame {
            args.push("--tame");
        }
        make_checkpoint(&dir, &args);
        dir
    })
}

/// The checkpoint (`tame` or not) converted with `recipe` by the command:
/// the drafter's file (`dspark`) or the main file; once each.
fn converted(recipe: &str, dspark: bool, tame: bool) -> PathBuf {
    static DONE: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let done = DONE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
    let part = if dspark { "dspark" } else { "main" };
    let key = format!("{part}-{recipe}-tame-{tame}");
    if let Some(p) = done.get(&key) {
        return p.clone();
    }
    let dir = fresh_dir("convert_dspark", &format!("out-{key}"));
    let out = dir.join(format!("tiny-{part}-{recipe}.gguf"));
    let extra: &[&str] = if dspark { &["--dspark-only"] } else { &[] };
    let o = convert(checkpoint(tame), recipe, extra, &out);
    assert!(
        o.status.success(),
        "{key}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Only the output is left in its folder (no partial file).
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    done.insert(key, out.clone());
    out
}

/// Every tensor's name, shape and type, in file order.
fn directory(f: &GgufFile) -> Vec<(String, Vec<u64>, GgmlType)> {
    f.tensor_infos()
        .iter()
        .map(|i| (i.name.clone(), i.ne.clone(), f.view(i).unwrap().ty))
        .collect()
}

/// The `dspark.*` keys of `f`, in order, with their values.
fn dspark_keys(f: &GgufFile) -> Vec<(String, String)> {
    f.metadata()
        .filter(|(k, _)| k.starts_with("dspark."))
        .map(|(k, v)| (k.to_string(), format!("{v:?}")))
        .collect()
}

/// `--dspark-only`: for every recipe, the drafter's file has the test-model
/// generator's drafter directory (names, shapes, order, types: its plan for
/// the tiny model, `DsparkSpec::for_model`) and `dspark.*` keys, the
/// architecture `deepseek4-dspark` and the name `NAME DSpark`.
#[test]
fn every_recipe_gives_the_generators_drafter_file() {
    let spec = TestModelSpec::tiny();
    let ds = DsparkSpec::for_model(&spec);
    for variant in Variant::ALL {
        let out = converted(variant.name(), true, false);
        let f = GgufFile::open(&out).unwrap();
        let gen = fresh_dir("convert_dspark", &format!("gen-{}", variant.name())).join("d.gguf");
        write_dspark(&spec, &ds, variant, VOCAB, &gen).unwrap();
        let g = GgufFile::open(&gen).unwrap();
        let (got, want) = (directory(&f), directory(&g));
        assert_eq!(got.len(), want.len(), "{}", variant.name());
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a, b, "{}", variant.name());
        }
        assert_eq!(dspark_keys(&f), dspark_keys(&g), "{}", variant.name());
        assert_eq!(f.get_str("general.architecture"), Some("deepseek4-dspark"));
        assert_eq!(f.get_str("general.name"), Some("DeepSeek V4 Flash DSpark"));
    }
    // Two stages of 24 block tensors, stage 0's two, the last stage's seven.
    let f = GgufFile::open(converted("q8", true, false)).unwrap();
    assert_eq!(f.tensor_infos().len(), 2 * 24 + 2 + 7);
}

/// A GGUF tensor dequantized to f32, row-major.
fn dequantize(f: &GgufFile, name: &str) -> Vec<f32> {
    let i = f.tensor_info(name).unwrap_or_else(|| panic!("{name}"));
    let v = f.view(i).unwrap();
    let ne0 = i.ne[0] as usize;
    let rb = v.ty.row_bytes(ne0 as u64).unwrap() as usize;
    let mut out = vec![0f32; v.data.len() / rb * ne0];
    for (src, dst) in v.data.chunks_exact(rb).zip(out.chunks_exact_mut(ne0)) {
        quant::dequantize_row(v.ty, src, dst).unwrap();
    }
    out
}

/// The checkpoint's main and drafter directories, checked against it.
fn layouts(ck: &Checkpoint) -> (Layout, Layout) {
    let file = ck.dir().join(CONFIG_FILE);
    let meta = V4Config::from_config(ck.config(), &file, "x").unwrap();
    let ds = DsparkMeta::from_config(ck.config(), &file, "x", &meta.model.core, Arch::V4).unwrap();
    let main = Layout::v4(&meta.model);
    let drafter = Layout::v4_dspark(&meta.model, &ds.config);
    main.check(ck).unwrap();
    drafter.check(ck).unwrap();
    (main, drafter)
}

/// The main map and the drafter's read every tensor of the checkpoint (a
/// weight with its `.scale`) exactly once between them; the f32 drafter
/// file holds, tensor by tensor, the decoded values of the checkpoint
/// tensors the release's names give ([`release_sources`]) bit for bit (FP8
/// `main_proj`, BF16 Markov and confidence heads, FP4 experts stacked in
/// expert order, F32 vectors).
#[test]
fn the_two_maps_read_every_tensor_once_and_f32_is_exact() {
    let ck = Checkpoint::open(checkpoint(false)).unwrap();
    let (main, drafter) = layouts(&ck);
    read_once(&ck, &main, &drafter);

    let f = GgufFile::open(converted("f32", true, false)).unwrap();
    let mut n = 0;
    for info in f.tensor_infos() {
        let mut want = Vec::new();
        for name in release_sources(&main, &info.name, &info.ne) {
            want.extend(Weight::open(&ck, &name).unwrap().to_f32());
        }
        let got = dequantize(&f, &info.name);
        assert_eq!(got.len(), want.len(), "{}", info.name);
        n += 1;
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{}",
            info.name
        );
    }
    assert_eq!(n, drafter.tensors.len());
}

/// `main` and `drafter` read every tensor of `ck` (a weight with its
/// `.scale`) exactly once between them, the drafter all of `mtp.*`.
fn read_once(ck: &Checkpoint, main: &Layout, drafter: &Layout) {
    let mut reads: HashMap<String, usize> = HashMap::new();
    for t in main.tensors.iter().chain(&drafter.tensors) {
        for (name, _) in t.sources() {
            if ck.get(&scale_name(&name)).is_some() {
                *reads.entry(scale_name(&name)).or_default() += 1;
            }
            *reads.entry(name).or_default() += 1;
        }
    }
    let names: HashSet<&str> = ck.names().collect();
    assert_eq!(reads.len(), names.len());
    for (name, n) in &reads {
        assert!(names.contains(name.as_str()), "{name} is read but absent");
        assert_eq!(*n, 1, "{name} read {n} times");
    }
    let mtp = names.iter().filter(|n| n.starts_with("mtp.")).count();
    let drafter_reads = drafter
        .tensors
        .iter()
        .flat_map(|t| t.sources())
        .map(|(n, _)| 1 + ck.get(&scale_name(&n)).is_some() as usize)
        .sum::<usize>();
    assert_eq!(drafter_reads, mtp);
}

/// The checkpoint tensors the drafter's GGUF tensor `gguf` (of shape `ne`)
/// holds, by the release's naming, independently of the converter's map:
/// the drafter's own tensors keep the official `DSparkBlock` names (the
/// HC head without `.weight`); a stage's block tensor `mtp.{k}.SUB` reads
/// what the main map reads for the router-biased layer 3's `blk.3.SUB`
/// (checked against the published Flash directory by
/// tests/convert_layout.rs), under `mtp.{k}.`, for the drafter's experts.
fn release_sources(main: &Layout, gguf: &str, ne: &[u64]) -> Vec<String> {
    let rest = gguf.strip_prefix("mtp.").unwrap();
    let (k, sub) = rest.split_once('.').unwrap();
    let own = [
        "main_proj.weight",
        "main_norm.weight",
        "norm.weight",
        "markov_head.markov_w1.weight",
        "markov_head.markov_w2.weight",
        "confidence_head.proj.weight",
    ];
    if own.contains(&sub) {
        return vec![gguf.to_string()];
    }
    if let Some(head) = sub.strip_prefix("hc_head_") {
        return vec![format!(
            "mtp.{k}.hc_head_{}",
            head.strip_suffix(".weight").unwrap()
        )];
    }
    let t = main
        .get(&format!("blk.3.{sub}"))
        .unwrap_or_else(|| panic!("{gguf}"));
    let n = if sub.ends_with("_exps.weight") {
        ne[2] as usize
    } else {
        1
    };
    let srcs: Vec<String> = t
        .sources()
        .into_iter()
        .map(|(name, _)| name.replace("layers.3.", &format!("mtp.{k}.")))
        .collect();
    assert!(srcs.len() >= n, "{gguf}");
    srcs[..n].to_vec()
}

/// The drafter's first-row logits (Markov bias included) after `ids` and
/// token 5, with the drafter file `ds` attached to the main file `main`.
fn dspark_logits(main: PathBuf, ds: PathBuf, ids: &[u32]) -> Vec<f32> {
    let mut m = ModelFile::open(main).unwrap();
    m.attach_dspark(ds)
        .expect("the loader attaches the converted drafter");
    draft_logits(AnyModel::V4(Arc::new(m)), DraftModel::Dspark, ids, 5)
}

/// The loader attaches the converted drafter to the converted main file
/// and reads the generator's configuration back; the q8 drafter's logits
/// agree with the f32 one's as closely as the MTP block's do
/// (tests/convert_write.rs, `TOLERANCE`: each Q8_0 weight is off by at most
/// 1/254 of its block's largest value; measured below).
#[test]
fn the_loader_attaches_it_and_q8_logits_agree_with_f32() {
    let mut m = ModelFile::open(converted("q8", false, true)).unwrap();
    m.attach_dspark(converted("q8", true, true)).unwrap();
    let ds = m.dspark.as_ref().unwrap();
    assert_eq!(ds.config, DsparkSpec::for_model(&TestModelSpec::tiny()));
    assert_eq!(ds.stages.len(), 2);

    let ids = [0u32, 7, 300, 511, 42, 42, 9, 100];
    let want = dspark_logits(
        converted("f32", false, true),
        converted("f32", true, true),
        &ids,
    );
    let got = dspark_logits(
        converted("q8", false, true),
        converted("q8", true, true),
        &ids,
    );
    assert_eq!(got.len(), VOCAB);
    assert!(got.iter().all(|x| x.is_finite()));
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = common::max_abs_diff(&got, &want) / scale;
    eprintln!("dspark q8: max|Δlogit| / max|logit| = {worst:.3e}");
    assert!(worst < TOLERANCE, "DSpark logits q8 vs f32: {worst}");
}

/// As tests/convert_write.rs's (the MTP block's and the main model's bound).
const TOLERANCE: f32 = 0.02;

/// `ds4 --dspark --mtp-model FILE` on the converted pair (q8, tame) prints
/// the text plain greedy decoding prints: drafts are verified, so any
/// drafter gives it; this runs the converted drafter end to end.
#[test]
fn ds4_dspark_on_the_converted_pair_prints_plain_text() {
    let figures = assert_dspark_prints_plain(
        &converted("q8", false, true),
        &converted("q8", true, true),
        "24",
    );
    eprintln!("v4: {figures}");
}

/// `--dspark-only` on `ck`, into an empty folder: the exit code, stderr,
/// and whether the folder stayed empty.
fn convert_fails(ck: &Path, tag: &str) -> (Option<i32>, String, bool) {
    let dir = fresh_dir("convert_dspark", tag);
    let out = dir.join("x.gguf");
    let o = convert(ck, "q8", &["--dspark-only"], &out);
    let empty = std::fs::read_dir(&dir).unwrap().count() == 0;
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into(),
        empty,
    )
}

/// A missing drafter tensor (a stage-1 expert, the Markov head), a
/// checkpoint without a drafter (the plain `--model v4` one) and
/// `config.json` values the loader refuses: exit 1 naming the file and the
/// tensor (checkpoint and GGUF names) or the `config.json` key, and the
/// output folder stays empty.
#[test]
fn a_missing_tensor_or_key_exits_1_and_leaves_no_output() {
    let vocab = VOCAB.to_string();
    for (k, drop, gguf) in [
        (
            0,
            "mtp.1.ffn.experts.2.w1.weight",
            "mtp.1.ffn_gate_exps.weight",
        ),
        (
            1,
            "mtp.1.markov_head.markov_w2.weight",
            "mtp.1.markov_head.markov_w2.weight",
        ),
        (2, "mtp.0.main_proj.scale", "mtp.0.main_proj.weight"),
    ] {
        let ck = fresh_dir("convert_dspark", &format!("drop-ck-{k}"));
        let args = [
            "--model", "v4", "--dspark", "--vocab", &vocab, "--drop", drop,
        ];
        make_checkpoint(&ck, &args);
        let (code, err, empty) = convert_fails(&ck, &format!("drop-out-{k}"));
        assert_eq!(code, Some(1), "{drop}: {err}");
        assert!(err.contains(drop) && err.contains(gguf), "{err}");
        // A missing tensor names the index; a missing scale the weight's shard.
        let file = if drop.ends_with(".scale") {
            "model-00003-of-00003.safetensors".to_string()
        } else {
            s(&ck.join(INDEX_FILE)).to_string()
        };
        assert!(err.contains(&file), "{err}");
        assert!(empty, "{drop}");
    }

    // No drafter: the MTP block's checkpoint.
    let plain = fresh_dir("convert_dspark", "plain-ck");
    make_checkpoint(&plain, &["--model", "v4", "--vocab", &vocab]);
    let (code, err, empty) = convert_fails(&plain, "plain-out");
    assert_eq!(code, Some(1), "{err}");
    let config = s(&plain.join(CONFIG_FILE)).to_string();
    assert!(
        err.contains(&config) && err.contains("no `dspark_block_size`"),
        "{err}"
    );
    assert!(empty);

    // config.json edited: values ds4's loader refuses, in config.json's terms.
    let edited = fresh_dir("convert_dspark", "edited-ck");
    for e in std::fs::read_dir(checkpoint(false)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), edited.join(e.file_name())).unwrap();
    }
    let original = std::fs::read_to_string(edited.join(CONFIG_FILE)).unwrap();
    type Edit = (&'static str, serde_json::Value, &'static str);
    let cases: [Edit; 5] = [
        (
            "dspark_target_layer_ids",
            serde_json::json!([3, 1]),
            "`dspark_target_layer_ids`: expected increasing layers below the model's 6",
        ),
        (
            "dspark_noise_token_id",
            serde_json::json!(600),
            "`dspark_noise_token_id`: expected a token below the model's vocabulary of 512",
        ),
        (
            "dspark_block_size",
            serde_json::json!(17),
            "`dspark_block_size`: expected at most 16",
        ),
        (
            "dspark_n_activated_experts",
            serde_json::json!(5),
            "5 of 4 experts per token",
        ),
        (
            "compress_ratios",
            serde_json::json!([0, 0, 4, 16, 4, 16, 0, 4]),
            "`compress_ratios[7]` (DSpark stage 1) is 4",
        ),
    ];
    for (k, (key, value, want)) in cases.into_iter().enumerate() {
        let mut c: serde_json::Value = serde_json::from_str(&original).unwrap();
        c[key] = value;
        std::fs::write(edited.join(CONFIG_FILE), c.to_string()).unwrap();
        let (code, err, empty) = convert_fails(&edited, &format!("edited-out-{k}"));
        assert_eq!(code, Some(1), "{key}: {err}");
        let config = s(&edited.join(CONFIG_FILE)).to_string();
        assert!(err.contains(&config) && err.contains(want), "{key}: {err}");
        assert!(empty, "{key}");
    }

    // One drafter at a time.
    let dir = fresh_dir("convert_dspark", "both-out");
    let out = dir.join("x.gguf");
    let args = [
        "--hf",
        s(checkpoint(false)),
        "--recipe",
        "q8",
        "--mtp",
        "--dspark-only",
        "-o",
        s(&out),
    ];
    let o = quantize_tool(&args);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--mtp and --dspark-only"));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

// ---- V4.1: `deepseek41-dspark` from `--model v41 --dspark` ----

/// The script's tiny V4.1 checkpoint (tame values) with the V4.1 drafter
/// (`DsparkSpec::for_v41`: two stages under `mtp.{k}.*`, the `dspark_*`
/// keys in `text_config`).
fn v41_checkpoint() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = fresh_dir("convert_dspark", "v41-checkpoint");
        let vocab = VOCAB.to_string();
        let args = ["--model", "v41", "--dspark", "--vocab", &vocab, "--tame"];
        make_checkpoint(&dir, &args);
        dir
    })
}

/// [`v41_checkpoint`] converted with `recipe`: the drafter's file or the
/// main file.
fn v41_converted(recipe: &str, dspark: bool) -> PathBuf {
    let part = if dspark { "dspark" } else { "main" };
    let dir = fresh_dir("convert_dspark", &format!("v41-{part}-{recipe}"));
    let out = dir.join(format!("tiny-v41-{part}-{recipe}.gguf"));
    let extra: &[&str] = if dspark { &["--dspark-only"] } else { &[] };
    let o = convert(v41_checkpoint(), recipe, extra, &out);
    assert!(
        o.status.success(),
        "v41 {part} {recipe}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// [`dspark_logits`] for V4.1 files.
fn v41_dspark_logits(main: PathBuf, ds: PathBuf, ids: &[u32]) -> Vec<f32> {
    let mut m = V41ModelFile::open(main).unwrap();
    m.attach_dspark(ds)
        .expect("the loader attaches the converted V4.1 drafter");
    draft_logits(AnyModel::V41(Arc::new(m)), DraftModel::Dspark, ids, 5)
}

/// `--dspark-only` on a V4.1 checkpoint: the drafter's file has the
/// generator's V4.1 drafter directory (`write_v41_dspark`: V4.1 stages with
/// both router biases, no head mix) and `dspark.*` keys for the recipes
/// the tiny V4.1 model has (q2 and q4 need rows of 256); the loader
/// attaches it to the converted V4.1 main file and reads the generator's
/// configuration back; the q8 pair's drafter logits agree with the f32
/// pair's within the V4 bound; `--mtp` on it exits 1 (V4.1 has no MTP
/// block).
#[test]
fn v41_drafter_converts_to_the_generators_file_and_attaches() {
    let spec = V41Spec::tiny();
    let ds = DsparkSpec::for_v41(&spec);
    for variant in [Variant::F32, Variant::Q8, Variant::Mxfp4] {
        let out = v41_converted(variant.name(), true);
        let f = GgufFile::open(&out).unwrap();
        let gen =
            fresh_dir("convert_dspark", &format!("v41-gen-{}", variant.name())).join("d.gguf");
        write_v41_dspark(&spec, &ds, variant, VOCAB, &gen).unwrap();
        let g = GgufFile::open(&gen).unwrap();
        assert_eq!(directory(&f), directory(&g), "{}", variant.name());
        assert_eq!(dspark_keys(&f), dspark_keys(&g), "{}", variant.name());
        assert_eq!(f.get_str("general.architecture"), Some("deepseek41-dspark"));
        assert_eq!(
            f.get_str("general.name"),
            Some("DeepSeek V4.1 Flash DSpark")
        );
    }
    let mut m = V41ModelFile::open(v41_converted("q8", false)).unwrap();
    m.attach_dspark(v41_converted("q8", true)).unwrap();
    let d = m.dspark.as_ref().unwrap();
    assert_eq!(d.config, ds);
    assert!(d.head_mix.is_none());

    let ids = [0u32, 7, 300, 511, 42, 42, 7, 300, 9];
    let want = v41_dspark_logits(
        v41_converted("f32", false),
        v41_converted("f32", true),
        &ids,
    );
    let got = v41_dspark_logits(v41_converted("q8", false), v41_converted("q8", true), &ids);
    assert_eq!(got.len(), VOCAB);
    assert!(got.iter().all(|x| x.is_finite()));
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = common::max_abs_diff(&got, &want) / scale;
    eprintln!("v41 dspark q8: max|Δlogit| / max|logit| = {worst:.3e}");
    assert!(worst < TOLERANCE, "V4.1 DSpark logits q8 vs f32: {worst}");

    // The V4.1 main map and the drafter's read every tensor once.
    let ck = Checkpoint::open(v41_checkpoint()).unwrap();
    let file = ck.dir().join(CONFIG_FILE);
    let meta = V41Meta::from_config(ck.config(), &file, "x", None).unwrap();
    let text = &ck.config()["text_config"];
    let d = DsparkMeta::from_config(text, &file, "x", &meta.config.core, Arch::V41).unwrap();
    let drafter = Layout::v41_dspark(&meta.config, &meta.spec, &d.config);
    drafter.check(&ck).unwrap();
    read_once(&ck, &Layout::v41(&meta.config, &meta.spec), &drafter);

    // `ds4 --dspark` on the converted V4.1 pair prints plain decoding's text.
    let figures = assert_dspark_prints_plain(
        &v41_converted("q8", false),
        &v41_converted("q8", true),
        "16",
    );
    eprintln!("v41: {figures}");

    let dir = fresh_dir("convert_dspark", "v41-mtp-out");
    let o = convert(v41_checkpoint(), "q8", &["--mtp"], &dir.join("x.gguf"));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no MTP block") && err.contains(CONFIG_FILE),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}
