//! Schedules that must not change the numbers: prefill in chunks vs one token
//! at a time, a snapshot restored vs the uninterrupted run, prefix reuse.

mod common;

use common::{max_abs_diff, tiny_model, tokens};
use ds4::model::forward::Numerics;
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::Variant;

fn session(numerics: Numerics, chunk: usize) -> Session {
    let opts = SessionOptions {
        ctx: 1024,
        prefill_chunk: chunk,
        numerics,
        ..Default::default()
    };
    Session::new(tiny_model(Variant::F32), opts).unwrap()
}

fn no_progress() -> impl FnMut(usize, usize) {
    |_, _| {}
}

#[test]
fn prefill_in_chunks_equals_decoding_one_by_one() {
    // 150 tokens: crosses the 32-token window, completes CSA (ratio 4) and
    // HCA (ratio 16) windows, and exceeds the indexer's top-k of 16 rows.
    let toks = tokens(150, 7);
    for numerics in [Numerics::Plain, Numerics::Model] {
        let mut a = session(numerics, 1);
        let mut b = session(numerics, 37);
        let mut c = session(numerics, 2048);
        let mut per_pos_a = Vec::new();
        for &t in &toks {
            a.eval(t).unwrap();
            per_pos_a.push(a.logits().to_vec());
        }
        b.sync(&toks, &mut no_progress()).unwrap();
        c.sync(&toks, &mut no_progress()).unwrap();
        let scored = c.score(&toks).unwrap();
        let v = a.logits().len();
        let d_chunk = max_abs_diff(a.logits(), b.logits());
        let d_whole = max_abs_diff(a.logits(), c.logits());
        let d_scored = (0..toks.len())
            .map(|i| max_abs_diff(&per_pos_a[i], &scored[i * v..(i + 1) * v]))
            .fold(0.0, f32::max);
        eprintln!("{numerics:?}: max |Δlogit| chunked {d_chunk:e}, whole {d_whole:e}, every position {d_scored:e}");
        // docs/VALIDATION.md: the schedule does not change a single bit.
        assert_eq!((d_chunk, d_whole, d_scored), (0.0, 0.0, 0.0));
    }
}

#[test]
fn snapshot_round_trip_continues_identically() {
    let toks = tokens(90, 11);
    let (head, tail) = toks.split_at(70);
    let mut a = session(Numerics::Model, 16);
    a.sync(head, &mut no_progress()).unwrap();
    let snap = a.save_snapshot().unwrap();
    for &t in tail {
        a.eval(t).unwrap();
    }
    let mut b = session(Numerics::Model, 16);
    b.load_snapshot(&snap).unwrap();
    assert_eq!(b.tokens(), head);
    for &t in tail {
        b.eval(t).unwrap();
    }
    assert_eq!(a.logits(), b.logits(), "restored run must be bit-identical");
    // A snapshot of the restored session is byte-identical to the original.
    let mut c = session(Numerics::Model, 16);
    c.load_snapshot(&snap).unwrap();
    assert_eq!(c.save_snapshot().unwrap(), snap);
    // Corrupt payloads are refused and leave an empty session.
    for cut in [0, 10, 52, snap.len() / 2, snap.len() - 1] {
        assert!(c.load_snapshot(&snap[..cut]).is_err());
        assert!(c.tokens().is_empty());
    }
    let mut extra = snap.clone();
    extra.push(0);
    assert!(c.load_snapshot(&extra).is_err());
}

#[test]
fn sync_reuses_a_matching_prefix() {
    let toks = tokens(60, 5);
    let mut a = session(Numerics::Model, 16);
    let s1 = a.sync(&toks[..40], &mut no_progress()).unwrap();
    assert_eq!((s1.reused, s1.evaluated), (0, 40));
    let s2 = a.sync(&toks, &mut no_progress()).unwrap();
    assert_eq!((s2.reused, s2.evaluated), (40, 20));
    let mut b = session(Numerics::Model, 16);
    b.sync(&toks, &mut no_progress()).unwrap();
    assert_eq!(a.logits(), b.logits(), "prefix reuse must be bit-identical");
    // A diverging request rebuilds from scratch.
    let mut other = toks.clone();
    other[10] ^= 1;
    let s3 = a.sync(&other, &mut no_progress()).unwrap();
    assert_eq!((s3.reused, s3.evaluated), (0, 60));
}

#[test]
fn bad_requests_are_errors_and_keep_the_state() {
    let mut a = session(Numerics::Model, 16);
    assert!(a.sync(&[], &mut no_progress()).is_err());
    let toks = tokens(20, 3);
    a.sync(&toks, &mut no_progress()).unwrap();
    let before = a.logits().to_vec();
    let too_long = tokens(2000, 9);
    assert!(matches!(
        a.sync(&too_long, &mut no_progress()),
        Err(ds4::session::SessionError::ContextFull { .. })
    ));
    assert!(a.eval(999_999).is_err());
    assert_eq!(a.tokens(), &toks[..]);
    assert_eq!(a.logits(), &before[..]);
}
