//! The disk KV cache on the tiny model: save → lookup → load continues with
//! bit-identical logits and only the suffix evaluated; the KVC layout byte by
//! byte; eviction order under a small budget; a corrupt-file corpus; a full
//! disk.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::kvcache::{file_names, random_words, session, sync_prefix, tokenizer};
use common::max_abs_diff;
use common::rng::Rng;
use ds4::kvcache::file::{self, KvcHeader, SaveReason};
use ds4::kvcache::{
    load_file, save_file, tool_map_for, CacheKey, DiskCache, KtmEntry, KvCacheConfig,
    LookupOutcome, NoToolIds, SaveMoments, StoreOutcome, ToolIds,
};

const CTX: usize = 1024;

fn no_progress() -> impl FnMut(usize, usize) {
    |_, _| {}
}

fn fresh_dir(name: &str) -> PathBuf {
    common::fresh_dir("kvcache-disk", name)
}

fn config(dir: &Path) -> KvCacheConfig {
    common::disk_cache_config(dir, 900)
}

fn open(cfg: &KvCacheConfig) -> DiskCache {
    DiskCache::open(cfg, 2)
        .unwrap()
        .unwrap()
        .with_logger(|m| eprintln!("log: {m}"))
}

/// A rendered chat prompt in ASCII between the markers, so every token
/// boundary is a character boundary.
fn rendered(turns: usize, seed: u64) -> String {
    let words = [
        "cache", "disk", "token", "prefix", "agent", "model", "prompt", "state", "layer",
        "restore", "file", "hash", "budget", "score", "write",
    ];
    let mut rng = Rng(seed | 1);
    let mut s = String::from("<｜begin▁of▁sentence｜>You are a careful assistant.");
    for t in 0..turns {
        s.push_str("<｜User｜>");
        s.push_str(&random_words(&words, 40, &mut rng));
        s.push_str(&format!("question {t}?<｜Assistant｜></think>answer {t}."));
        s.push_str("<｜end▁of▁sentence｜>");
    }
    s
}

#[test]
fn save_lookup_load_continues_bit_identically() {
    let tok = tokenizer();
    let dir = fresh_dir("roundtrip");
    let cfg = config(&dir);
    let cache = open(&cfg);
    let text = rendered(5, 3);
    let p = tok.encode_chat(&text);
    assert!(p.len() > 200 && p.len() < 600, "{} tokens", p.len());
    let k = p.len() * 2 / 3;

    // A: the first request stops at the boundary and stores it.
    let mut a = session(CTX);
    let head = sync_prefix(&mut a, &tok, &p, k);
    assert!(text.as_bytes().starts_with(&head));
    let StoreOutcome::Stored { sha, bytes } =
        cache.store(&a, &head, CacheKey::Tokens, SaveReason::Cold, &[])
    else {
        panic!("store failed")
    };
    assert_eq!(sha, file::sha1_hex(&head));
    assert_eq!(
        cache.store(&a, &head, CacheKey::Tokens, SaveReason::Evict, &[]),
        StoreOutcome::AlreadyStored { sha: sha.clone() }
    );

    // The file, byte by byte against KVCACHE.md §4.
    let raw = fs::read(dir.join(format!("{sha}.kv"))).unwrap();
    assert_eq!(raw.len() as u64, bytes);
    let u32_at = |o: usize| u32::from_le_bytes(raw[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(raw[o..o + 8].try_into().unwrap());
    assert_eq!(&raw[..4], b"KVC\x01");
    assert_eq!(raw[4], 2, "routed quant bits of an F32 model");
    assert_eq!(raw[5], 1, "reason cold");
    assert_eq!(raw[6], 0, "no extension flags");
    assert_eq!(u32_at(8) as usize, k);
    assert_eq!(u32_at(12), 0, "hits");
    assert_eq!(u32_at(16) as usize, CTX);
    assert_eq!(u64_at(24), u64_at(32), "created = last used");
    let tb = u32_at(48) as usize;
    assert_eq!(tb, head.len());
    assert_eq!(&raw[52..52 + tb], &head[..]);
    let payload = &raw[52 + tb..];
    assert_eq!(u64_at(40), payload.len() as u64);
    assert_eq!(payload, &a.save_snapshot().unwrap()[..]);
    assert_eq!(&payload[..4], b"DSV4");
    // Our checksum sits in ds4's reserved bytes (7, 20..24).
    assert_eq!(
        u32_at(20),
        file::checksum(&head, payload),
        "checksum of text and payload"
    );

    // B: a restarted server finds the prefix on disk.
    let mut b = session(CTX);
    let LookupOutcome::Hit(hit) = cache.lookup(&mut b, text.as_bytes()) else {
        panic!("expected a disk hit")
    };
    assert_eq!((hit.tokens, hit.text_bytes), (k, head.len()));
    assert_eq!(b.tokens(), &p[..k]);
    assert_eq!(b.logits(), a.logits(), "restored logits are the saved ones");
    let suffix = tok.encode_chat(std::str::from_utf8(&text.as_bytes()[hit.text_bytes..]).unwrap());
    let mut effective = b.tokens().to_vec();
    effective.extend_from_slice(&suffix);
    let sb = b.sync(&effective, &mut no_progress()).unwrap();
    assert_eq!(
        (sb.reused, sb.evaluated),
        (k, suffix.len()),
        "only the suffix is evaluated"
    );
    let sa = a.sync(&effective, &mut no_progress()).unwrap();
    assert_eq!(sa.reused, k);
    assert_eq!(a.logits(), b.logits(), "bit-identical after the suffix");
    for _ in 0..8 {
        let next = argmax(a.logits());
        a.eval(next).unwrap();
        b.eval(next).unwrap();
        assert_eq!(a.logits(), b.logits(), "bit-identical while decoding");
    }
    // A full prefill of the same tokens agrees to rounding.
    let mut c = session(CTX);
    c.sync(&effective, &mut no_progress()).unwrap();
    let mut b2 = session(CTX);
    assert!(matches!(
        cache.lookup(&mut b2, text.as_bytes()),
        LookupOutcome::Hit(_)
    ));
    b2.sync(&effective, &mut no_progress()).unwrap();
    assert!(max_abs_diff(c.logits(), b2.logits()) < 1e-4);

    // Each hit is counted in the header (hits + 1, last used).
    let h = header_of(&dir.join(format!("{sha}.kv")));
    assert_eq!(h.hits, 2);
    let m = cache.metrics().snapshot();
    assert_eq!(
        (m.hits, m.misses, m.saves, m.bytes_written),
        (2, 0, 1, bytes)
    );
    assert!(m.prometheus().contains("ds4_kv_disk_hits_total 2\n"));

    // A prompt that does not start with the text misses.
    let mut d = session(CTX);
    assert_eq!(
        cache.lookup(&mut d, b"<something else>"),
        LookupOutcome::Miss
    );
    assert!(d.tokens().is_empty());
    // A session with a smaller context skips the file.
    let mut small = session(512);
    assert_eq!(
        cache.lookup(&mut small, text.as_bytes()),
        LookupOutcome::Miss
    );
    // Strict quant matching skips a file of other quant bits.
    let strict = DiskCache::open(
        &KvCacheConfig {
            kv_cache_reject_different_quant: true,
            ..cfg.clone()
        },
        4,
    )
    .unwrap()
    .unwrap();
    assert_eq!(strict.lookup(&mut d, text.as_bytes()), LookupOutcome::Miss);
    let lenient = DiskCache::open(&cfg, 4).unwrap().unwrap();
    assert!(matches!(
        lenient.lookup(&mut d, text.as_bytes()),
        LookupOutcome::Hit(_)
    ));
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn header_of(path: &Path) -> KvcHeader {
    let raw = fs::read(path).unwrap();
    KvcHeader::decode(raw[..48].try_into().unwrap()).unwrap()
}

#[test]
fn longest_prefix_wins_and_visible_keys_and_tool_maps() {
    let tok = tokenizer();
    let dir = fresh_dir("longest");
    let cfg = config(&dir);
    let cache = open(&cfg);
    let text = rendered(4, 9);
    let p = tok.encode_chat(&text);
    let mut s = session(CTX);
    let mut stored = Vec::new();
    for k in [40, 120, 90] {
        let head = sync_prefix(&mut s, &tok, &p, k);
        assert!(matches!(
            cache.store(&s, &head, CacheKey::Tokens, SaveReason::Continued, &[]),
            StoreOutcome::Stored { .. }
        ));
        stored.push((k, head.len()));
    }
    // A visible-transcript key covering more bytes than any token file, with a tool map.
    s.sync(&p[..150], &mut no_progress()).unwrap();
    let visible = &text.as_bytes()[..tok.decode(&p[..160]).len()];
    let map = vec![KtmEntry {
        id: b"call_7".to_vec(),
        dsml: b"<dsml block>".to_vec(),
    }];
    assert!(matches!(
        cache.store(
            &s,
            visible,
            CacheKey::ThinkingVisible,
            SaveReason::Shutdown,
            &map
        ),
        StoreOutcome::Stored { .. }
    ));
    let mut b = session(CTX);
    let LookupOutcome::Hit(hit) = cache.lookup(&mut b, text.as_bytes()) else {
        panic!()
    };
    assert_eq!((hit.tokens, hit.text_bytes), (150, visible.len()));
    assert_eq!(hit.ext_flags, file::EXT_TOOL_MAP | file::EXT_THINKING_TEXT);
    // The map's block is not in the cache text, so it cannot be one the
    // writer found there: read back as damaged and dropped (the round trip
    // is `ktm_section_round_trips_and_damage_is_detected`).
    assert!(hit.tool_map.is_empty());
    assert_eq!(hit.reason, SaveReason::Shutdown);
    assert!(cache.prefetch_tool_ids(&|id| id == b"call_7").is_empty());
    // Without the visible file, the longest token-text prefix (120) wins.
    fs::remove_file(dir.join(format!("{}.kv", hit.sha))).unwrap();
    let mut c = session(CTX);
    let LookupOutcome::Hit(hit) = cache.lookup(&mut c, text.as_bytes()) else {
        panic!()
    };
    assert_eq!((hit.tokens, hit.text_bytes), stored[1]);
    // A prompt ending inside the 120-token text takes the 90-token file.
    let cut = &text.as_bytes()[..stored[1].1 - 1];
    let LookupOutcome::Hit(hit) = cache.lookup(&mut c, cut) else {
        panic!()
    };
    assert_eq!((hit.tokens, hit.text_bytes), stored[2]);
    // Too short to store.
    s.sync(&p[..10], &mut no_progress()).unwrap();
    assert!(matches!(
        cache.store(
            &s,
            &tok.decode(&p[..10]),
            CacheKey::Tokens,
            SaveReason::Cold,
            &[]
        ),
        StoreOutcome::Skipped(_)
    ));
}

/// A tool memory: (id, block) pairs.
struct Memory(Vec<(String, String)>);

impl ToolIds for Memory {
    fn for_each_tool_id(&self, f: &mut dyn FnMut(&[u8], &[u8])) {
        for (id, b) in &self.0 {
            f(id.as_bytes(), b.as_bytes());
        }
    }
}

/// A sampled DSML block calling `name` (seeded argument text).
fn dsml_block(name: &str, seed: u64) -> String {
    format!(
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"{name}\">\n<｜DSML｜parameter name=\"n\" string=\"false\">{}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40
    )
}

#[test]
fn ktm_section_round_trips_and_damage_is_detected() {
    let tok = tokenizer();
    let dir = fresh_dir("ktm");
    let mut cfg = config(&dir);
    // Reader bound: at most 4 × 3 = 12 entries.
    cfg.tool_memory_max_ids = 3;
    let cache = open(&cfg);
    // A conversation with two sampled tool calls (the second made of two
    // ids, as parallel calls share one block) and the results.
    let (a, b) = (dsml_block("bash", 11), dsml_block("grep", 12));
    let prompt = format!(
        "{}<｜User｜>run it<｜Assistant｜></think>Sure.{a}<｜end▁of▁sentence｜><｜User｜><tool_result>ok</tool_result><｜Assistant｜></think>{b}<｜end▁of▁sentence｜><｜User｜><tool_result>x</tool_result><｜Assistant｜></think>",
        rendered(1, 21)
    );
    let p = tok.encode_chat(&prompt);
    let text = tok.decode(&p);
    assert_eq!(text, prompt.as_bytes());
    let mut s = session(CTX);
    s.sync(&p, &mut no_progress()).unwrap();
    let memory = Memory(vec![
        ("call_b2".into(), b.clone()),
        ("call_a".into(), a.clone()),
        ("call_b1".into(), b.clone()),
        ("call_old".into(), dsml_block("ls", 13)),
    ]);
    let map = tool_map_for(&text, &memory);
    let ids: Vec<&[u8]> = map.iter().map(|e| &e.id[..]).collect();
    assert_eq!(ids, [&b"call_a"[..], b"call_b1", b"call_b2"]);
    let StoreOutcome::Stored { sha, bytes } =
        cache.store(&s, &text, CacheKey::Tokens, SaveReason::Evict, &map)
    else {
        panic!()
    };
    // The section is ds4's layout, at the end of the file, bit0 set.
    let path = dir.join(format!("{sha}.kv"));
    let raw = fs::read(&path).unwrap();
    assert_eq!(raw.len() as u64, bytes);
    let mut ktm = b"KTM\x01".to_vec();
    ktm.extend_from_slice(&3u32.to_le_bytes());
    for e in &map {
        ktm.extend_from_slice(&(e.id.len() as u32).to_le_bytes());
        ktm.extend_from_slice(&(e.dsml.len() as u32).to_le_bytes());
        ktm.extend_from_slice(&e.id);
        ktm.extend_from_slice(&e.dsml);
    }
    assert!(raw.ends_with(&ktm));
    assert_eq!(raw[6] & file::EXT_TOOL_MAP, file::EXT_TOOL_MAP);
    let ktm_at = raw.len() - ktm.len();
    assert_eq!(file::decode_ktm(&raw[ktm_at..], 12), map);
    // Round trip through lookup and through the prefetch.
    let mut fresh = session(CTX);
    let LookupOutcome::Hit(hit) = cache.lookup(&mut fresh, prompt.as_bytes()) else {
        panic!()
    };
    assert_eq!(hit.tool_map, map);
    assert_eq!(cache.prefetch_tool_ids(&|_| true), map);
    assert_eq!(cache.prefetch_tool_ids(&|id| id == b"call_b1"), map[1..2]);
    let original = fs::read(&path).unwrap();

    // Damage to the section: the session still loads (the map is
    // auxiliary, outside the checksum); the map keeps only what is sound.
    let e0 = ktm_at + 8; // first entry
    let e1 = e0 + 8 + map[0].id.len() + map[0].dsml.len();
    let put = |b: &mut Vec<u8>, at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Damage, usize)> = vec![
        ("magic", Box::new(move |b| b[ktm_at] ^= 0x20), 0),
        ("version", Box::new(move |b| b[ktm_at + 3] = 2), 0),
        (
            "count over 4 x max ids",
            Box::new(move |b| put(b, ktm_at + 4, 13)),
            0,
        ),
        (
            "first dsml length over 512 MiB",
            Box::new(move |b| put(b, e0 + 4, (512 << 20) + 1)),
            0,
        ),
        ("second id length 0", Box::new(move |b| put(b, e1, 0)), 1),
        (
            "second id length 257",
            Box::new(move |b| put(b, e1, 257)),
            1,
        ),
        (
            "cut inside the second entry",
            Box::new(move |b| b.truncate(e1 + 12)),
            1,
        ),
        (
            "cut inside the third entry",
            Box::new(|b| {
                let n = b.len() - 3;
                b.truncate(n)
            }),
            2,
        ),
        // A flipped byte in a block: not a block of the text any more.
        (
            "first block byte",
            Box::new(move |b| b[e0 + 8 + 6 + 20] ^= 0x01),
            2,
        ),
    ];
    for (i, (what, damage, left)) in cases.iter().enumerate() {
        let d = fresh_dir(&format!("ktm-{i}"));
        let mut bytes = original.clone();
        damage(&mut bytes);
        fs::write(d.join(format!("{sha}.kv")), &bytes).unwrap();
        let c = open(&KvCacheConfig {
            kv_disk_dir: Some(d.clone()),
            ..cfg.clone()
        });
        let mut s2 = session(CTX);
        let LookupOutcome::Hit(hit) = c.lookup(&mut s2, prompt.as_bytes()) else {
            panic!("{what}: the state no longer loads")
        };
        assert_eq!(hit.tokens, p.len(), "{what}");
        assert_eq!(s2.logits(), s.logits(), "{what}");
        let want: Vec<KtmEntry> = match *what {
            "first block byte" => map[1..].to_vec(),
            _ => map[..*left].to_vec(),
        };
        assert_eq!(hit.tool_map, want, "{what}");
        assert_eq!(c.prefetch_tool_ids(&|_| true), want, "{what}");
    }
}

#[test]
fn a_file_over_the_cold_maximum_is_consumed() {
    let tok = tokenizer();
    let dir = fresh_dir("consumed");
    let cfg = KvCacheConfig {
        kv_cache_cold_max_tokens: 64,
        ..config(&dir)
    };
    let cache = open(&cfg);
    let text = rendered(3, 5);
    let p = tok.encode_chat(&text);
    let mut s = session(CTX);
    s.sync(&p[..100], &mut no_progress()).unwrap();
    cache.store(
        &s,
        &tok.decode(&p[..100]),
        CacheKey::Tokens,
        SaveReason::Evict,
        &[],
    );
    let mut b = session(CTX);
    let LookupOutcome::Hit(hit) = cache.lookup(&mut b, text.as_bytes()) else {
        panic!()
    };
    assert!(hit.consumed);
    assert!(file_names(&dir).is_empty());
}

/// A synthetic checkpoint: eviction reads only headers and sizes.
fn synthetic(dir: &Path, text: &str, tokens: u32, hits: u32, used: u64, payload: usize) -> String {
    common::synthetic_checkpoint(dir, CTX, text, tokens, hits, used, payload)
}

#[test]
fn eviction_order_under_a_small_budget() {
    let dir = fresh_dir("evict");
    let now = 1_800_000_000u64;
    const SZ: usize = 300_000;
    // Scores (§8): (decayed hits + 1) · tokens / size, per 300 KB:
    let low = synthetic(&dir, "low", 100, 0, now - 60, SZ); // 100
    let mid = synthetic(&dir, "mid", 200, 0, now - 60, SZ); // 200
    let hot = synthetic(&dir, "hot", 100, 3, now - 60, SZ); // ≈ 399 (one minute of decay)
    let stale = synthetic(&dir, "stale", 100, 3, now - 5 * 86400, SZ); // hits decay below 0.01: 100, used earlier than low
    let fresh = synthetic(&dir, "fresh", 1, 0, now, SZ); // lowest, but protected
    let big = synthetic(&dir, "big", 5000, 0, now, 4 * SZ); // 1250
                                                            // Opening runs eviction under the configured (roomy) budget: nothing goes.
    let mut cache = open(&config(&dir));
    assert_eq!(file_names(&dir).len(), 6);
    // 2.70 MB in 2.15 MB: stale goes first (ties low, used earlier), then low.
    let order = eviction_sequence(&mut cache, 2_150_000, now, Some(&fresh));
    assert_eq!(order, vec![stale, low]);
    let mut want: Vec<String> = [&fresh, &hot, &mid, &big]
        .iter()
        .map(|s| format!("{s}.kv"))
        .collect();
    want.sort();
    assert_eq!(file_names(&dir), want);
    // Without protection, by score: fresh (1 token), mid (200), hot (≈ 399);
    // big (1250) alone fits 1.3 MB.
    assert_eq!(
        eviction_sequence(&mut cache, 1_300_000, now, None),
        vec![fresh, mid, hot]
    );
    assert_eq!(file_names(&dir), vec![format!("{big}.kv")]);
    // A protected file alone over the budget loses its protection.
    let dir2 = fresh_dir("evict2");
    let huge = synthetic(&dir2, "huge", 10, 0, now, 1_200_000);
    let other = synthetic(&dir2, "other", 10, 0, now, 1000);
    let mut cache2 = open(&config(&dir2));
    assert_eq!(
        eviction_sequence(&mut cache2, 1 << 20, now, Some(&huge)),
        vec![huge]
    );
    assert_eq!(file_names(&dir2), vec![format!("{other}.kv")]);
    // A store runs eviction protecting the new file (real sessions).
    let tok = tokenizer();
    let dir3 = fresh_dir("evict3");
    let text = rendered(2, 21);
    let p = tok.encode_chat(&text);
    let mut s = session(CTX);
    s.sync(&p[..40], &mut no_progress()).unwrap();
    let mut cfg3 = config(&dir3);
    cfg3.kv_disk_space_mb = 1; // one tiny-model file is about 0.53 MB
    let cache3 = open(&cfg3);
    let first = tok.decode(&p[..40]);
    let StoreOutcome::Stored { sha: a, .. } =
        cache3.store(&s, &first, CacheKey::Tokens, SaveReason::Cold, &[])
    else {
        panic!()
    };
    s.sync(&p[..50], &mut no_progress()).unwrap();
    let StoreOutcome::Stored { sha: b, .. } = cache3.store(
        &s,
        &tok.decode(&p[..50]),
        CacheKey::Tokens,
        SaveReason::Cold,
        &[],
    ) else {
        panic!()
    };
    assert_ne!(a, b);
    assert_eq!(
        file_names(&dir3),
        vec![format!("{b}.kv")],
        "the older file made room"
    );
    assert_eq!(cache3.metrics().snapshot().evictions, 1);
}

/// Runs eviction under `budget` at `now`; the deleted names in order.
fn eviction_sequence(
    cache: &mut DiskCache,
    budget: u64,
    now: u64,
    protected: Option<&str>,
) -> Vec<String> {
    let before = cache.metrics().snapshot().evictions;
    cache.set_now(Some(now));
    let got: Vec<String> = cache
        .evict_within(budget, protected)
        .into_iter()
        .map(|e| e.sha)
        .collect();
    assert_eq!(
        cache.metrics().snapshot().evictions,
        before + got.len() as u64
    );
    got
}

#[test]
fn disk_full_fails_the_save_and_keeps_serving() {
    let tok = tokenizer();
    let dir = fresh_dir("full");
    let cfg = config(&dir);
    let mut cache = open(&cfg);
    let text = rendered(3, 7);
    let p = tok.encode_chat(&text);
    let mut s = session(CTX);
    let first = sync_prefix(&mut s, &tok, &p, 60);
    let StoreOutcome::Stored { bytes, .. } =
        cache.store(&s, &first, CacheKey::Tokens, SaveReason::Cold, &[])
    else {
        panic!()
    };
    let before = file_names(&dir);
    let second = sync_prefix(&mut s, &tok, &p, 80);
    for limit in [0, 1, 47, 52, 53 + second.len() as u64, bytes / 2, bytes - 1] {
        cache.set_write_limit(Some(limit));
        let r = cache.store(&s, &second, CacheKey::Tokens, SaveReason::Continued, &[]);
        assert!(
            matches!(&r, StoreOutcome::Failed(m) if m.contains("space")),
            "{limit}: {r:?}"
        );
        assert_eq!(
            file_names(&dir),
            before,
            "no new or temp file after a failed write"
        );
    }
    assert_eq!(cache.metrics().snapshot().save_failures, 7);
    // The session was not touched: it continues and the next save works.
    assert_eq!(s.tokens(), &p[..80]);
    cache.set_write_limit(None);
    assert!(matches!(
        cache.store(&s, &second, CacheKey::Tokens, SaveReason::Continued, &[]),
        StoreOutcome::Stored { .. }
    ));
    let mut b = session(CTX);
    let LookupOutcome::Hit(hit) = cache.lookup(&mut b, text.as_bytes()) else {
        panic!()
    };
    assert_eq!(hit.tokens, 80);
    // The CLI path: one file at a chosen path, same format.
    let path = dir.join("chat.kvc");
    save_file(&path, &s, &second, SaveReason::Unknown).unwrap();
    let mut c = session(CTX);
    let (h, t) = load_file(&path, &mut c).unwrap();
    assert_eq!((h.tokens, t), (80, second.clone()));
    assert_eq!(c.logits(), s.logits());
    assert!(load_file(&dir.join("missing.kvc"), &mut c).is_err());
}

/// What a mutated file must do at lookup.
#[derive(Debug, PartialEq)]
enum Expect {
    /// Loads, and the state is the original (the mutation was metadata).
    Hit,
    /// Invisible to the scan or skipped; the file stays.
    MissKept,
    /// Never loadable: removed.
    Removed,
    /// Load tried and refused (layout); the file stays, the session is empty.
    FailedKept,
}

#[test]
fn corrupt_file_corpus() {
    let tok = tokenizer();
    let dir = fresh_dir("corpus-src");
    let cache = open(&config(&dir));
    let text = rendered(3, 13);
    let p = tok.encode_chat(&text);
    let k = 70;
    let mut s = session(CTX);
    let head = sync_prefix(&mut s, &tok, &p, k);
    let StoreOutcome::Stored { sha, .. } =
        cache.store(&s, &head, CacheKey::Tokens, SaveReason::Cold, &[])
    else {
        panic!()
    };
    let name = format!("{sha}.kv");
    let good = fs::read(dir.join(&name)).unwrap();
    let tb = head.len();
    let pay = 52 + tb; // payload start
    let len = good.len();

    let mut cases: Vec<(String, Vec<u8>, Expect)> = Vec::new();
    for cut in [0, 1, 30, 47, 48, 51] {
        cases.push((
            format!("truncated to {cut}"),
            good[..cut].to_vec(),
            Expect::MissKept,
        ));
    }
    for cut in [
        52,
        53,
        pay - 1,
        pay,
        pay + 13,
        pay + 52,
        (pay + len) / 2,
        len - 1,
    ] {
        cases.push((
            format!("truncated to {cut}"),
            good[..cut].to_vec(),
            Expect::Removed,
        ));
    }
    let flip = |off: usize, mask: u8| {
        let mut b = good.clone();
        b[off] ^= mask;
        b
    };
    let header_flips = [
        (0, 0x01, Expect::MissKept, "magic"),
        (3, 0x02, Expect::MissKept, "version"),
        (4, 0x01, Expect::MissKept, "quant bits 2 → 3"),
        (5, 0x02, Expect::Hit, "reason"),
        (
            7,
            0xff,
            Expect::Hit,
            "checksum mark cleared (a ds4-touched header)",
        ),
        (8, 0x01, Expect::Removed, "token count"),
        (12, 0x10, Expect::Hit, "hits"),
        (17, 0x40, Expect::MissKept, "ctx above the session's"),
        (21, 0x01, Expect::Removed, "checksum"),
        (26, 0x01, Expect::Hit, "created"),
        (33, 0x01, Expect::Hit, "last used"),
        (40, 0x01, Expect::Removed, "payload size"),
        (44, 0x01, Expect::Removed, "payload size beyond the file"),
        // The name no longer matches the prefix of that length: never chosen,
        // left to eviction (ds4 reads the text only of the chosen file).
        (48, 0x01, Expect::MissKept, "text length"),
    ];
    for (off, mask, want, what) in header_flips {
        cases.push((format!("header byte {off} ({what})"), flip(off, mask), want));
    }
    for off in [52, 52 + tb / 2, pay - 1] {
        cases.push((format!("text byte {off}"), flip(off, 0x20), Expect::Removed));
    }
    for off in [
        pay,
        pay + 8,
        pay + 28,
        pay + 52,
        pay + 52 + 4 * k,
        (pay + len) / 2,
        len - 1,
    ] {
        cases.push((
            format!("payload byte {off}"),
            flip(off, 0x04),
            Expect::Removed,
        ));
    }
    // A file of another model shape (payload layer count) with a valid checksum.
    let mut shape = good.clone();
    shape[pay + 32] ^= 1;
    let sum = file::checksum(&head, &shape[pay..]);
    shape[20..24].copy_from_slice(&sum.to_le_bytes());
    cases.push(("other model shape".into(), shape, Expect::FailedKept));
    // ds4-written files carry no checksum: payload header damage still fails
    // the layout check, and the file is kept.
    let mut plain = good.clone();
    plain[7] = 0;
    plain[20..24].fill(0);
    let mut plain_shape = plain.clone();
    plain_shape[pay + 36] ^= 1;
    cases.push((
        "no checksum, other head dim".into(),
        plain_shape,
        Expect::FailedKept,
    ));
    cases.push(("no checksum, intact".into(), plain, Expect::Hit));

    let work = fresh_dir("corpus");
    let cfg = config(&work);
    let mut results = Vec::new();
    for (what, bytes, want) in cases {
        for f in file_names(&work) {
            fs::remove_file(work.join(f)).unwrap();
        }
        let path = work.join(&name);
        fs::write(&path, &bytes).unwrap();
        let cache = open(&cfg);
        let mut b = session(CTX);
        let got = match cache.lookup(&mut b, text.as_bytes()) {
            LookupOutcome::Hit(hit) => {
                assert_eq!(hit.tokens, k, "{what}");
                assert_eq!(b.tokens(), &p[..k], "{what}");
                assert_eq!(
                    b.logits(),
                    s.logits(),
                    "{what}: loaded state must be the saved one"
                );
                Expect::Hit
            }
            LookupOutcome::Miss => {
                assert!(b.tokens().is_empty());
                if path.exists() {
                    Expect::MissKept
                } else {
                    Expect::Removed
                }
            }
            LookupOutcome::Failed {
                removed,
                invalidated,
                ..
            } => {
                assert!(
                    b.tokens().is_empty(),
                    "{what}: a failed load leaves the session empty"
                );
                assert_eq!(removed, !path.exists());
                if removed {
                    Expect::Removed
                } else {
                    assert!(invalidated, "{what}");
                    Expect::FailedKept
                }
            }
        };
        assert_eq!(got, want, "{what}");
        results.push(what);
    }
    eprintln!("corrupt corpus: {} cases, all as expected", results.len());
}

#[test]
fn a_restarted_worker_resumes_with_only_the_suffix_evaluated() {
    let tok = tokenizer();
    let dir = fresh_dir("restart");
    let cfg = KvCacheConfig {
        kv_cache_continued_interval_tokens: 100,
        kv_cache_boundary_align_tokens: 64, // continued step 128
        ..config(&dir)
    };
    // First server: a cold request, a few generated tokens, then shutdown.
    let mut w1 = SaveMoments::new(open(&cfg));
    let mut live = session(CTX);
    let turn1 = rendered(6, 17);
    let r1 = w1.resume_from_disk(&mut live, &tok, &turn1, None, &NoToolIds);
    assert_eq!((r1.cached, r1.hit.is_some()), (0, false));
    let st = w1
        .prefill(
            &mut live,
            &tok,
            &r1.effective,
            r1.cached,
            &mut no_progress(),
            &NoToolIds,
        )
        .unwrap();
    assert_eq!(st.evaluated, r1.effective.len());
    let n1 = r1.effective.len();
    assert!(n1 > 256, "{n1} tokens cross two continued frontiers");
    // Saved so far: the cold boundary (the chat anchor is too short here, so
    // the trimmed, aligned length) and the frontiers 128, 256, … ≤ n1.
    let sp = tok.specials();
    let cold = cfg
        .cold_boundary(&r1.effective, 0, sp.user, sp.assistant)
        .unwrap();
    assert_eq!(cold, (n1 - 32) / 64 * 64);
    let mut points: Vec<usize> = (1..=n1 / 128).map(|k| k * 128).collect();
    points.push(cold);
    points.sort();
    points.dedup();
    let expect_files = points.len();
    let mut lens: Vec<usize> = file_names(&dir)
        .iter()
        .map(|f| header_of(&dir.join(f)).tokens as usize)
        .collect();
    lens.sort();
    assert_eq!(lens, points, "cold + continued checkpoints");
    for _ in 0..6 {
        w1.before_decode(&live, &tok, &NoToolIds);
        let next = argmax(live.logits());
        live.eval(next).unwrap();
    }
    assert!(matches!(
        w1.shutdown(&live, &tok, None, &NoToolIds),
        Some(StoreOutcome::Stored { .. })
    ));
    let stored = live.tokens().to_vec();
    let saves = w1.cache.metrics().snapshot().saves;
    assert_eq!(saves as usize, expect_files + 1);
    drop(w1);

    // Second server, same folder: the next turn of the conversation.
    let mut turn2 = String::from_utf8(tok.decode(&stored)).unwrap();
    turn2.push_str("<｜end▁of▁sentence｜><｜User｜>and one more question?<｜Assistant｜></think>");
    let mut w2 = SaveMoments::new(open(&cfg));
    let mut fresh = session(CTX);
    let r2 = w2.resume_from_disk(&mut fresh, &tok, &turn2, None, &NoToolIds);
    let hit = r2.hit.clone().expect("the shutdown checkpoint is found");
    assert_eq!(hit.reason, SaveReason::Shutdown);
    assert_eq!(r2.cached, stored.len(), "usage cached_tokens");
    assert_eq!(&r2.effective[..stored.len()], &stored[..]);
    assert_eq!(w2.continued_frontier(), stored.len());
    let st2 = w2
        .prefill(
            &mut fresh,
            &tok,
            &r2.effective,
            r2.cached,
            &mut no_progress(),
            &NoToolIds,
        )
        .unwrap();
    assert_eq!(
        (st2.reused, st2.evaluated),
        (stored.len(), r2.effective.len() - stored.len()),
        "only the suffix is evaluated"
    );
    assert_eq!(w2.cache.metrics().snapshot().hits, 1);
    // The first server's session, continued the same way, is bit-identical.
    live.sync(&r2.effective, &mut no_progress()).unwrap();
    assert_eq!(live.logits(), fresh.logits());
    // A different conversation replaces the live one: evict save first.
    let other = rendered(2, 99);
    let before = w2.cache.metrics().snapshot().saves;
    let r3 = w2.resume_from_disk(&mut fresh, &tok, &other, None, &NoToolIds);
    assert_eq!(r3.cached, 0);
    assert_eq!(
        w2.cache.metrics().snapshot().saves,
        before + 1,
        "evict save"
    );
    // … and coming back to the second conversation finds the evicted state.
    let mut back = turn2.clone();
    back.push_str("more");
    let mut s3 = session(CTX);
    let r4 = w2.resume_from_disk(&mut s3, &tok, &back, None, &NoToolIds);
    assert_eq!(
        r4.hit.map(|h| (h.reason, h.tokens)),
        Some((SaveReason::Evict, r2.effective.len()))
    );
}
