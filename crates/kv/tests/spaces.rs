//! KV spaces on an array in memory: queries agree with a model before
//! and after the deferred sort and indexes; kill -9 and power loss during
//! inserts lose no acknowledged batch and keep no half insert; a sort cut
//! short at any step resumes and ends with every record exactly once;
//! bad input changes nothing.

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt64Type};
use arrow_array::{ArrayRef, Float32Array, Int32Array, RecordBatch, UInt64Array};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tessera_array::device::{Device, Faults, MemoryDevice};
use tessera_array::{Array, ArrayError};
use tessera_kv::{KvError, Query, SpaceSchema, Store, StoreOptions};

/// (key, energy, charge)
type Record = (u64, f32, i32);

fn schema(duplicates: &str) -> SpaceSchema {
    serde_json::from_str(&format!(
        r#"{{"key":"id","fields":[{{"name":"id","type":"u64"}},{{"name":"energy","type":"f32"}},
            {{"name":"charge","type":"i32"}}],"indexes":["energy","charge"],"duplicates":"{duplicates}"}}"#
    ))
    .unwrap()
}

fn batch(records: &[Record]) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from_iter_values(records.iter().map(|r| r.0))),
        Arc::new(Float32Array::from_iter_values(records.iter().map(|r| r.1))),
        Arc::new(Int32Array::from_iter_values(records.iter().map(|r| r.2))),
    ];
    RecordBatch::try_new(schema("keep_all").arrow(), columns).unwrap()
}

fn records(batches: &[RecordBatch]) -> Vec<Record> {
    let mut out = Vec::new();
    for b in batches {
        let ids = b.column(0).as_primitive::<UInt64Type>();
        let e = b.column(1).as_primitive::<Float32Type>();
        let q = b.column(2).as_primitive::<arrow_array::types::Int32Type>();
        out.extend((0..b.num_rows()).map(|i| (ids.value(i), e.value(i), q.value(i))));
    }
    out
}

fn random_records(rng: &mut impl Rng, n: usize, keys: u64) -> Vec<Record> {
    (0..n)
        .map(|_| {
            (
                rng.gen_range(0..keys),
                rng.gen_range(-2.0f32..10.0),
                rng.gen_range(-50..50),
            )
        })
        .collect()
}

fn devices() -> Vec<Arc<MemoryDevice>> {
    (0..6).map(|_| Arc::new(MemoryDevice::new(48 << 20))).collect()
}

fn named(devices: &[Arc<MemoryDevice>]) -> Vec<(String, Arc<dyn Device>)> {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("m{i}"), d.clone() as Arc<dyn Device>))
        .collect()
}

fn new_array(devices: &[Arc<MemoryDevice>]) -> Arc<Array> {
    Arc::new(tessera_array::create(named(devices), &tessera_array::CreateOptions::new(4, 2)).unwrap())
}

/// Power loss: the members stop at once, and of each write not yet synced
/// keep `(index, length)` of its leading bytes reached the media (all,
/// none or part, in any mix: a volatile cache's reordering); then the
/// array opens again.
fn crash_and_reopen(
    devices: &[Arc<MemoryDevice>],
    array: Arc<Array>,
    mut keep: impl FnMut(usize, usize) -> usize,
) -> Arc<Array> {
    let dead = Arc::new(AtomicBool::new(true));
    for d in devices {
        d.set_faults(Faults {
            dead: Some(dead.clone()),
            ..Faults::default()
        });
    }
    drop(array);
    for d in devices {
        d.set_faults(Faults::default());
        d.crash_with(&mut keep);
    }
    let list = named(devices).into_iter().map(|(n, d)| (n, Some(d))).collect();
    Arc::new(tessera_array::open(list).unwrap())
}

/// What power loss leaves of a write of `len` bytes: all, none, or a
/// torn part.
fn lost(rng: &mut impl Rng, len: usize) -> usize {
    match rng.gen_range(0..3) {
        0 => len,
        1 => 0,
        _ => rng.gen_range(0..=len),
    }
}

/// `all` less the records of `some` (both sorted), or a record of `some`
/// that `all` lacks.
fn without(all: Vec<Record>, some: &[Record]) -> Result<Vec<Record>, Record> {
    let key = |r: &Record| (r.0, r.1.to_bits(), r.2);
    let mut rest = Vec::new();
    let mut wanted = some.iter().peekable();
    for r in all {
        match wanted.peek() {
            Some(w) if key(w) == key(&r) => {
                wanted.next();
            }
            Some(w) if key(w) < key(&r) => return Err(**w),
            _ => rest.push(r),
        }
    }
    wanted.next().map_or(Ok(rest), |w| Err(*w))
}

fn quiet(sort_memory: usize) -> StoreOptions {
    StoreOptions {
        sort_memory,
        background: false,
        busy_rate: None,
        ..StoreOptions::default()
    }
}

fn sorted(mut r: Vec<Record>) -> Vec<Record> {
    r.sort_by_key(|a| (a.0, a.1.to_bits(), a.2));
    r
}

/// The queries checked, and what the model says each returns.
/// Which records a query should return.
type Wanted = Box<dyn Fn(&Record) -> bool>;

fn queries() -> Vec<(Query, Wanted)> {
    let q = |json: &str| serde_json::from_str::<Query>(json).unwrap();
    vec![
        (q(r#"{"get":17}"#), Box::new(|r| r.0 == 17)),
        (q(r#"{"get":100000}"#), Box::new(|r| r.0 == 100000)),
        (
            q(r#"{"keys":{"ge":100,"lt":180}}"#),
            Box::new(|r| (100..180).contains(&r.0)),
        ),
        (q(r#"{"keys":{"gt":3990}}"#), Box::new(|r| r.0 > 3990)),
        (q(r#"{"where":{"field":"energy","gt":9.5}}"#), Box::new(|r| r.1 > 9.5)),
        (
            q(r#"{"where":{"field":"energy","ge":-0.25,"le":0.25}}"#),
            Box::new(|r| (-0.25..=0.25).contains(&r.1)),
        ),
        (q(r#"{"where":{"field":"charge","lt":-45}}"#), Box::new(|r| r.2 < -45)),
        (
            q(r#"{"where":{"field":"charge","gt":3.5,"lt":5}}"#),
            Box::new(|r| r.2 == 4),
        ),
        (q(r#""all""#), Box::new(|_| true)),
    ]
}

/// Checks every query's records against the model, and with `indexed`,
/// whether tables answered it.
fn check_queries(store: &Store, name: &str, model: &[Record], indexed: Option<bool>) {
    let space = store.space(name).unwrap();
    for (query, wanted) in queries() {
        let result = space.query(&query).unwrap();
        let want: Vec<Record> = model.iter().filter(|r| wanted(r)).copied().collect();
        assert_eq!(sorted(records(&result.batches)), sorted(want), "{query:?}");
        if let Some(indexed) = indexed.filter(|_| query != Query::All) {
            assert_eq!(result.indexed, indexed, "{query:?}");
        }
    }
}

/// The model of a space whose schema keeps only a key's last record.
fn last_of_each(model: &[Record]) -> Vec<Record> {
    let mut last = std::collections::BTreeMap::new();
    for r in model {
        last.insert(r.0, *r);
    }
    last.into_values().collect()
}

/// The batch cache answers a query asked again, never from a table that
/// is gone (a space dropped and made again under its name lays its tables
/// at the same offsets of a volume of the same name), keeps within its
/// budget, and a scan leaves nothing in it.
#[test]
fn a_query_asked_again_is_answered_from_the_batch_cache_never_from_a_dropped_table() {
    let devices = devices();
    let array = new_array(&devices);
    let budget = 1 << 20;
    let options = StoreOptions {
        cache_bytes: budget,
        ..quiet(64 << 10)
    };
    let store = Store::open(array, options).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let hot: Query = serde_json::from_str(r#"{"where":{"field":"energy","gt":8.5}}"#).unwrap();
    for round in 0..3 {
        store.create("c", schema("keep_all")).unwrap();
        let model = random_records(&mut rng, 30_000, 1 << 40);
        store.space("c").unwrap().insert(&[batch(&model)]).unwrap();
        store.finalize("c").unwrap();
        store.work_all().unwrap();
        let space = store.space("c").unwrap();
        let want = sorted(model.iter().filter(|r| r.1 > 8.5).copied().collect());
        let first = space.query(&hot).unwrap();
        assert!(first.indexed);
        assert_eq!(
            first.cached_bytes, 0,
            "round {round}: answered from a table that is gone"
        );
        assert_eq!(sorted(records(&first.batches)), want, "round {round}");
        let again = space.query(&hot).unwrap();
        assert!(again.frame_bytes > 0);
        assert_eq!(again.cached_bytes, again.frame_bytes, "round {round}");
        assert_eq!(sorted(records(&again.batches)), want, "round {round}");
        // A scan of the whole table (~500 KiB, over a quarter of the
        // budget) is answered whole and keeps nothing new.
        let held = store.cache();
        let all = space.query(&Query::All).unwrap();
        assert_eq!(sorted(records(&all.batches)), sorted(model.clone()));
        assert_eq!(store.cache().batches, held.batches, "round {round}");
        assert!(store.cache().bytes <= budget as u64);
        // Keys looked up at random: the cache stays within its budget.
        for _ in 0..200 {
            let key = model[rng.gen_range(0..model.len())].0;
            let got = space.query(&Query::Get(key)).unwrap();
            assert!(records(&got.batches).iter().all(|r| r.0 == key) && got.rows() >= 1);
            assert!(store.cache().bytes <= budget as u64);
        }
        assert!(store.cache().batches > 0);
        if round == 0 {
            // As if a query were under way: the dropped space's tables
            // outlive the drop, so their batches stay until pushed out,
            // and the next round's first query must not take them.
            store.drop_space("c").unwrap();
            assert!(store.cache().batches > 0);
            drop(space);
        } else {
            drop(space);
            store.drop_space("c").unwrap();
            let left = store.cache();
            assert_eq!(
                (left.batches, left.bytes),
                (0, 0),
                "round {round}: a dropped space's batches kept"
            );
        }
    }
    let status = store.cache();
    assert!(status.hits > 0 && status.misses > 0, "{status:?}");
}

#[test]
fn queries_agree_with_a_model_before_and_after_the_sort_and_indexes() {
    for duplicates in ["keep_all", "keep_last"] {
        let devices = devices();
        let array = new_array(&devices);
        // 64 KiB of sort memory: runs of ~1,500 records, so many runs.
        let store = Store::open(array.clone(), quiet(64 << 10)).unwrap();
        store.create("p", schema(duplicates)).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut model = Vec::new();
        for _ in 0..25 {
            let n = rng.gen_range(0..2500);
            let r = random_records(&mut rng, n, 4000);
            assert_eq!(store.space("p").unwrap().insert(&[batch(&r)]).unwrap(), n as u64);
            model.extend(r);
        }
        let model = if duplicates == "keep_last" {
            last_of_each(&model)
        } else {
            model
        };
        check_queries(&store, "p", &model, Some(false));
        let log_bytes = store.space("p").unwrap().status().log_bytes;
        assert!(log_bytes > 0);
        assert!(store.finalize("p").unwrap());
        assert!(!store.finalize("p").unwrap(), "finalizing twice");
        check_queries(&store, "p", &model, Some(false));
        store.work_all().unwrap();
        let status = store.space("p").unwrap().status();
        assert_eq!(status.phase, tessera_kv::Phase::Ready);
        assert_eq!(status.sorted, Some(model.len() as u64));
        assert_eq!(status.log_bytes, 0, "the log is gone once the table replaced it");
        // The log (from 2 MiB) is trimmed: its blocks hold no data.
        let volume = array.volume("kv.p").unwrap();
        assert_eq!(volume.allocation(2 << 20, log_bytes).unwrap(), [(log_bytes, false)]);
        check_queries(&store, "p", &model, Some(true));
        // Table order: by key, and by energy for the energy index.
        let space = store.space("p").unwrap();
        let keys = records(&space.query(&Query::All).unwrap().batches);
        assert!(keys.windows(2).all(|w| w[0].0 <= w[1].0));
        let q: Query = serde_json::from_str(r#"{"where":{"field":"energy","ge":0}}"#).unwrap();
        let by_energy = records(&space.query(&q).unwrap().batches);
        assert!(by_energy.windows(2).all(|w| w[0].1 <= w[1].1));
        // A point get reads a batch or two of the many the table has,
        // each of at most KEY_TABLE_ROWS records (and its frame).
        let got = space.query(&Query::Get(17)).unwrap();
        let all = space.query(&Query::All).unwrap();
        let per_record = all.frame_bytes / model.len() as u64;
        let batch_bytes = tessera_kv::KEY_TABLE_ROWS as u64 * per_record + (4 << 10);
        assert!(
            got.frame_bytes <= 2 * batch_bytes,
            "{} bytes read, {per_record} bytes a record",
            got.frame_bytes
        );
        if duplicates == "keep_all" {
            // ~30,000 records: 8 batches (keep_last's 4,000 keys fit one).
            assert!(
                all.frame_bytes >= 4 * got.frame_bytes,
                "{} of {} bytes",
                got.frame_bytes,
                all.frame_bytes
            );
        }
        // Reopened (a clean stop), the same answers, from the tables.
        drop(space);
        drop(store);
        let store = Store::open(array.clone(), quiet(64 << 10)).unwrap();
        check_queries(&store, "p", &model, Some(true));
    }
}

#[test]
fn power_loss_during_inserts_keeps_every_acknowledged_batch_and_no_half_insert() {
    for seed in 0..12u64 {
        let devices = devices();
        let mut array = new_array(&devices);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let store = Store::open(array.clone(), quiet(1 << 20)).unwrap();
        store.create("s", schema("keep_all")).unwrap();
        drop(store);
        let mut acked: Vec<Record> = Vec::new();
        for round in 0..3 {
            let dead = Arc::new(AtomicBool::new(false));
            for d in &devices {
                d.set_faults(Faults {
                    dead: Some(dead.clone()),
                    ..Faults::default()
                });
            }
            let store = Store::open(array.clone(), quiet(1 << 20)).unwrap();
            let space = store.space("s").unwrap();
            let inserts: Vec<Vec<Record>> = (0..rng.gen_range(1..16))
                .map(|_| {
                    // Up to 640 KiB: an insert's frames span stripes.
                    let n = rng.gen_range(1..40_000);
                    random_records(&mut rng, n, 1 << 40)
                })
                .collect();
            // The process dies once this many records are in, while the
            // next insert is under way (or after the last).
            let target: u64 = inserts[..rng.gen_range(0..inserts.len())]
                .iter()
                .map(|r| r.len() as u64)
                .sum();
            let done = std::thread::scope(|scope| {
                let writer = scope.spawn(|| {
                    let mut done = Vec::new();
                    for (i, r) in inserts.iter().enumerate() {
                        // Two batches an insert, so an insert spans frames.
                        let (a, b) = r.split_at(r.len() / 2);
                        match space.insert(&[batch(a), batch(b)]) {
                            // What a dead process says reaches no client.
                            Ok(_) if dead.load(Ordering::SeqCst) => break,
                            Ok(_) => done.push(i),
                            Err(e) => {
                                assert!(dead.load(Ordering::SeqCst), "seed {seed} round {round}: {e}");
                                break;
                            }
                        }
                    }
                    done
                });
                while space.status().inserted < target && !writer.is_finished() {
                    std::thread::yield_now();
                }
                // Into the next insert, some way.
                std::thread::sleep(std::time::Duration::from_micros(rng.gen_range(0..2000)));
                dead.store(true, Ordering::SeqCst);
                writer.join().unwrap()
            });
            drop(space);
            drop(store);
            // kill -9 (every write kept) or power loss.
            let keep_all = rng.gen_bool(0.5);
            array = crash_and_reopen(
                &devices,
                array,
                |_, len| if keep_all { len } else { lost(&mut rng, len) },
            );
            for &i in &done {
                acked.extend(&inserts[i]);
            }
            let store = Store::open(array.clone(), quiet(1 << 20)).unwrap();
            let found = records(&store.space("s").unwrap().query(&Query::All).unwrap().batches);
            // Every acknowledged insert, and whole inserts beyond them.
            let extra = without(sorted(found.clone()), &sorted(acked.clone()))
                .unwrap_or_else(|r| panic!("seed {seed} round {round}: acknowledged {r:?} lost"));
            let whole = inserts
                .iter()
                .enumerate()
                .filter(|(i, _)| !done.contains(i))
                .scan(Vec::new(), |taken: &mut Vec<Record>, (_, r)| {
                    taken.extend(r);
                    Some(sorted(taken.clone()))
                })
                .any(|prefix| prefix == extra);
            assert!(
                extra.is_empty() || whole,
                "seed {seed} round {round}: {} records of a half insert",
                extra.len()
            );
            acked = found;
        }
    }
}

#[test]
fn a_sort_cut_short_at_any_step_resumes_with_every_record_once() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut model = Vec::new();
    let mut inserts = Vec::new();
    for _ in 0..12 {
        let n = rng.gen_range(100..2000);
        let r = random_records(&mut rng, n, 3000);
        model.extend(r.clone());
        inserts.push(r);
    }
    let mut steps_seen = 0;
    for cut in 0.. {
        assert!(cut < 10_000, "the sort never ends");
        let devices = devices();
        let mut array = new_array(&devices);
        let store = Store::open(array.clone(), quiet(64 << 10)).unwrap();
        let space = store.create("s", schema("keep_all")).unwrap();
        for r in &inserts {
            space.insert(&[batch(r)]).unwrap();
        }
        store.finalize("s").unwrap();
        // Stop after `cut` checks, then lose power (keeping a random
        // part of what was not synced), then finish the work.
        let checks = AtomicUsize::new(0);
        let result = space.work(64 << 10, &|| checks.fetch_add(1, Ordering::Relaxed) >= cut, &mut |_| {});
        drop(space);
        drop(store);
        let finished = result.is_ok();
        assert!(finished || matches!(result, Err(KvError::Stopped)), "{result:?}");
        array = crash_and_reopen(&devices, array, |_, len| lost(&mut rng, len));
        let store = Store::open(array, quiet(64 << 10)).unwrap();
        // Every record once, whether tables or the log answer.
        check_queries(&store, "s", &model, finished.then_some(true));
        store.work_all().unwrap();
        check_queries(&store, "s", &model, Some(true));
        if finished {
            steps_seen = cut;
            break;
        }
    }
    assert!(
        steps_seen > 15,
        "only {steps_seen} steps: the cuts did not land in runs and merges"
    );
}

#[test]
fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let devices = devices();
    let array = new_array(&devices);
    let store = Store::open(array.clone(), quiet(1 << 20)).unwrap();
    let space = store.create("s", schema("keep_all")).unwrap();
    space.insert(&[batch(&[(1, 1.0, 1)])]).unwrap();
    let wrong_type = RecordBatch::try_new(
        Arc::new(arrow_schema::Schema::new(vec![
            arrow_schema::Field::new("id", arrow_schema::DataType::UInt64, false),
            arrow_schema::Field::new("energy", arrow_schema::DataType::Float64, false),
            arrow_schema::Field::new("charge", arrow_schema::DataType::Int32, false),
        ])),
        vec![
            Arc::new(UInt64Array::from(vec![2])),
            Arc::new(arrow_array::Float64Array::from(vec![2.0])),
            Arc::new(Int32Array::from(vec![2])),
        ],
    )
    .unwrap();
    let with_nulls = RecordBatch::try_new(
        Arc::new(arrow_schema::Schema::new(vec![
            arrow_schema::Field::new("id", arrow_schema::DataType::UInt64, true),
            arrow_schema::Field::new("energy", arrow_schema::DataType::Float32, true),
            arrow_schema::Field::new("charge", arrow_schema::DataType::Int32, true),
        ])),
        vec![
            Arc::new(UInt64Array::from(vec![Some(3), None])),
            Arc::new(Float32Array::from(vec![3.0, 3.0])),
            Arc::new(Int32Array::from(vec![3, 3])),
        ],
    )
    .unwrap();
    let good = batch(&[(4, 4.0, 4)]);
    for (bad, why) in [(&wrong_type, "of type Float64"), (&with_nulls, "1 nulls")] {
        let err = space.insert(&[good.clone(), bad.clone()]).unwrap_err();
        assert!(
            matches!(err, KvError::SchemaMismatch { .. }) && err.to_string().contains(why),
            "{err}"
        );
    }
    assert_eq!(
        space.status().inserted,
        1,
        "a refused insert inserted nothing, its good batch neither"
    );
    assert!(matches!(
        store.create("s", schema("keep_all")),
        Err(KvError::SpaceExists { .. })
    ));
    assert!(matches!(
        store.create("bad/name", schema("keep_all")),
        Err(KvError::BadName { .. })
    ));
    let mut no_key = schema("keep_all");
    no_key.key = "nope".into();
    assert!(matches!(store.create("t", no_key), Err(KvError::BadSchema { .. })));
    assert!(
        array.volumes().iter().all(|v| v.name != "kv.t"),
        "a refused space leaves no volume"
    );
    assert!(matches!(store.space("nope"), Err(KvError::UnknownSpace { .. })));
    assert!(matches!(store.drop_space("nope"), Err(KvError::UnknownSpace { .. })));
    let bad_query: Query = serde_json::from_str(r#"{"where":{"field":"mass","gt":1}}"#).unwrap();
    assert!(matches!(space.query(&bad_query), Err(KvError::BadQuery { .. })));
    store.finalize("s").unwrap();
    assert!(matches!(
        space.insert(std::slice::from_ref(&good)),
        Err(KvError::Finalized { .. })
    ));
    assert_eq!(space.status().inserted, 1);

    // A full array: the insert fails, typed, and leaves nothing, now or
    // after a crash.
    let full = store.create("full", schema("keep_all")).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut acked = 0u64;
    let err = loop {
        let r = random_records(&mut rng, 200_000, u64::MAX);
        match full.insert(&[batch(&r)]) {
            Ok(n) => acked += n,
            Err(e) => break e,
        }
        assert!(acked < 100_000_000, "the array never filled");
    };
    assert!(matches!(err, KvError::Array(ArrayError::NoSpace)), "{err}");
    assert_eq!(full.status().inserted, acked);
    let count = |store: &Store| store.space("full").unwrap().query(&Query::All).unwrap().rows() as u64;
    assert_eq!(count(&store), acked);
    drop(full);
    drop(space);
    drop(store);
    let array = crash_and_reopen(&devices, array, |_, len| len);
    let store = Store::open(array, quiet(1 << 20)).unwrap();
    assert_eq!(count(&store), acked, "the failed insert came back after a crash");
    store.drop_space("full").unwrap();
    assert!(matches!(store.space("full"), Err(KvError::UnknownSpace { .. })));
}

#[test]
fn a_volume_that_holds_no_space_is_left_out_and_the_others_served() {
    let devices = devices();
    let array = new_array(&devices);
    let store = Store::open(array.clone(), quiet(1 << 20)).unwrap();
    store
        .create("good", schema("keep_all"))
        .unwrap()
        .insert(&[batch(&[(1, 1.0, 1)])])
        .unwrap();
    drop(store);
    // A volume of a space's name whose manifest is junk.
    let junk = array.create_volume("kv.junk", 4 << 20).unwrap();
    junk.write(0, &[0x5a; 8192], false).unwrap();
    let store = Store::open(array.clone(), quiet(1 << 20)).unwrap();
    assert!(
        store.broken()["junk"].contains("no space manifest"),
        "{:?}",
        store.broken()
    );
    let err = store.space("junk").err().unwrap().to_string();
    assert!(err.contains("could not be opened"), "{err}");
    assert_eq!(store.space("good").unwrap().status().inserted, 1);
    assert!(store.list().iter().all(|s| s.name != "junk"));
}

#[test]
fn a_space_finalized_empty_is_ready_and_answers_nothing() {
    let devices = devices();
    let array = new_array(&devices);
    let store = Store::open(array, quiet(1 << 20)).unwrap();
    let space = store.create("empty", schema("keep_last")).unwrap();
    space.insert(&[batch(&[])]).unwrap();
    store.finalize("empty").unwrap();
    store.work_all().unwrap();
    let status = space.status();
    assert_eq!((status.phase, status.sorted), (tessera_kv::Phase::Ready, Some(0)));
    check_queries(&store, "empty", &[], Some(true));
}
