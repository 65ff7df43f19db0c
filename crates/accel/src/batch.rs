//! Coalescing: the seals and hashes that many threads ask for at once go
//! to the backend as a few large batches, the way a group commit merges
//! FLUSHes.
//!
//! An array hands its accelerator one stripe (or one write's pieces) per
//! call, from whichever client thread filled it. A GPU given one 92+8
//! stripe runs 100 threads of the ~270,000 it can hold, and each SHA3-512
//! thread takes milliseconds over its 64 KiB, so calls of one stripe leave
//! it idle; 16 such calls merged cost the same milliseconds.
//!
//! [`Batching`] wraps a backend. A caller queues its request, then either
//! finds it done or, while fewer than `lanes` batches of its class (seals,
//! or hashes) are running, becomes the leader: it takes the oldest request
//! of that class and every queued request of the same kind (shape, or hash
//! algorithm), up to `max_bytes` of input, runs them as one call of the
//! backend on its own thread, and hands each request its part of the
//! results. Requests therefore wait for no timer: a lone caller runs at
//! once, and requests gather only while the backend is busy. A request
//! waits at most for the `lanes` batches of its class ahead of it and its
//! own, each bounded by `max_bytes`: that is the bound on what a FLUSH
//! waits for beyond its own stripes.
//!
//! Seals and hashes have lanes of their own because a client write waits
//! for its hashes, while stripes seal behind it: with shared lanes, a
//! write's hashes waited for a lane behind GPU seal batches of several
//! milliseconds each.
//!
//! The requests' buffers stay borrowed by their callers, who block until
//! their request is answered, so the leader may use them meanwhile; a
//! request is answered only after the call that used it has returned (or
//! unwound). A batch that fails is run again request by request, so each
//! caller gets its own error; a batch whose leader panicked answers its
//! requests with an error instead of leaving them waiting.
//!
//! Reconstruction and ranged decoding pass straight through: their callers
//! (rebuild, scrub, degraded reads) batch already.

use crate::{AccelError, Accelerator, Leaves, ReconstructJob, SealJob, Shape, Work};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use tessera_checksum::{Algorithm, Digest};

/// Seal batches in flight at once when the environment names no other
/// number (hash batches: [`DEFAULT_HASH_LANES`]). A GPU batch of a few
/// stripes takes as long as one thread hashing one 64 KiB chunk
/// (milliseconds) whatever its size, and batches in flight
/// run side by side on the GPU. On an H200, 92+8 writes with SHA3-512 ran
/// at 0.50 GB/s unbatched, 0.81 with two in flight, 1.15 with four and
/// 1.17 with eight (at 30% more CPU).
pub const DEFAULT_LANES: usize = 4;

/// Hash batches in flight at once by default in front of a GPU. A hash
/// launch takes as long as one 64 KiB SHA3-512 (2.4 ms on an H200, a warp
/// a message) however few messages it holds, so with 16 client writes in
/// flight and four lanes a write waited for a lane as long as for its own
/// hashes: on an H200, a write's p50 went from 4.7-5.4 ms with four to
/// 3.3 ms with eight (docs/PERFORMANCE.md, issue 28 part 4). With sixteen
/// it was no shorter and the array wrote slower (the GPU backend's 16
/// staging slots: 4 seal batches take up to 2 each, a hash batch one).
pub const DEFAULT_HASH_LANES: usize = 8;

/// Input bytes a batch takes at most, by default: 64 MiB is about 1 ms of
/// PCIe and 5-10 ms of packing, which bounds what a request waits for.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

/// A borrowed byte range, sent to the leader's thread. Sound because its
/// owner blocks until the request is answered (see the module's doc).
#[derive(Clone, Copy)]
struct Span {
    at: *mut u8,
    len: usize,
}

// SAFETY: a Span is only dereferenced by the leader while the request that
// holds it is unanswered, and its owner is blocked until then.
unsafe impl Send for Span {}

impl Span {
    fn of(bytes: &[u8]) -> Span {
        Span {
            at: bytes.as_ptr().cast_mut(),
            len: bytes.len(),
        }
    }
    fn of_mut(bytes: &mut [u8]) -> Span {
        Span {
            at: bytes.as_mut_ptr(),
            len: bytes.len(),
        }
    }
    /// SAFETY: the owner is blocked and nothing else uses the range.
    unsafe fn bytes<'a>(self) -> &'a [u8] {
        unsafe { std::slice::from_raw_parts(self.at, self.len) }
    }
    /// SAFETY: as `bytes`, and the owner lent it mutably.
    unsafe fn bytes_mut<'a>(self) -> &'a mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.at, self.len) }
    }
}

/// What a request asks for.
enum Asked {
    /// Stripes of one shape: each one's data and parity.
    Seal(Shape, Vec<(Span, Span)>),
    /// Buffers to digest.
    Hash(Algorithm, Vec<Span>),
}

/// Requests that may share a call: the same shape, or the same algorithm.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Seal(Shape),
    Hash(Algorithm),
}

impl Key {
    /// The class whose lanes it runs in: 0 seals, 1 hashes.
    fn class(&self) -> usize {
        match self {
            Key::Seal(_) => 0,
            Key::Hash(_) => 1,
        }
    }
}

impl Asked {
    fn key(&self) -> Key {
        match self {
            Asked::Seal(shape, _) => Key::Seal(*shape),
            Asked::Hash(algorithm, _) => Key::Hash(*algorithm),
        }
    }
    fn bytes(&self) -> usize {
        match self {
            Asked::Seal(shape, jobs) => jobs.len() * shape.data * shape.chunk_bytes,
            Asked::Hash(_, inputs) => inputs.iter().map(|s| s.len).sum(),
        }
    }
}

/// A request's answer.
enum Answer {
    Sealed(Result<Vec<Leaves>, AccelError>),
    Hashed(Vec<Digest>),
    /// The leader panicked while running it.
    Lost,
}

struct Request {
    id: u64,
    work: Asked,
}

impl Request {
    /// A seal's stripes (a batch holds one kind of request).
    fn stripes(&self) -> &[(Span, Span)] {
        match &self.work {
            Asked::Seal(_, stripes) => stripes,
            Asked::Hash(..) => unreachable!("a batch holds one kind"),
        }
    }

    /// A hash's inputs.
    fn spans(&self) -> &[Span] {
        match &self.work {
            Asked::Hash(_, spans) => spans,
            Asked::Seal(..) => unreachable!("a batch holds one kind"),
        }
    }
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Batches running, per class (`Key::class`).
    running: [usize; 2],
    queue: VecDeque<Request>,
    answers: HashMap<u64, Answer>,
}

/// A caller's request until it is answered (see [`Batching::forget`]).
struct Pending<'b> {
    owner: &'b Batching,
    id: u64,
    answered: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.owner.forget(self.id);
        }
    }
}

/// A backend whose concurrent seals and hashes are merged into batches.
pub struct Batching {
    inner: Arc<dyn Accelerator>,
    /// Batches in flight at most, by class (seals, hashes).
    lanes: [usize; 2],
    max_bytes: usize,
    state: Mutex<State>,
    answered: Condvar,
    calls: AtomicU64,
    batches: AtomicU64,
}

impl Batching {
    /// Wraps `inner`: at most `lanes` batches run at once, each of at most
    /// `max_bytes` of input (a single larger request still runs alone).
    pub fn new(inner: Arc<dyn Accelerator>, lanes: usize, max_bytes: usize) -> Batching {
        Batching {
            inner,
            lanes: [lanes.max(1); 2],
            max_bytes: max_bytes.max(1),
            state: Mutex::new(State::default()),
            answered: Condvar::new(),
            calls: AtomicU64::new(0),
            batches: AtomicU64::new(0),
        }
    }

    /// The same with `lanes` hash batches in flight at most (seals keep theirs).
    pub fn with_hash_lanes(mut self, lanes: usize) -> Batching {
        self.lanes[1] = lanes.max(1);
        self
    }

    /// Requests taken so far, and the backend calls they were merged into.
    pub fn merged(&self) -> (u64, u64) {
        (self.calls.load(Ordering::Relaxed), self.batches.load(Ordering::Relaxed))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `work`, then waits for its answer, leading batches (its own
    /// or older ones) while a lane is free.
    fn submit(&self, work: Asked) -> Answer {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.queue.push_back(Request { id, work });
        let mut pending = Pending {
            owner: self,
            id,
            answered: false,
        };
        loop {
            if let Some(answer) = state.answers.remove(&id) {
                pending.answered = true;
                return answer;
            }
            if let Some(at) = self.runnable(&state) {
                let batch = self.take(&mut state, at);
                state.running[batch[0].work.key().class()] += 1;
                drop(state);
                self.lead(batch);
                state = self.lock();
                continue;
            }
            state = self.answered.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Forgets request `id` of a caller that is unwinding (it panicked
    /// leading a batch): a queued request leaves the queue, and one that
    /// another leader is running is waited for, since its buffers are on
    /// the unwinding stack.
    fn forget(&self, id: u64) {
        let mut state = self.lock();
        if let Some(at) = state.queue.iter().position(|r| r.id == id) {
            state.queue.remove(at);
            return;
        }
        while state.answers.remove(&id).is_none() {
            state = self.answered.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Where in the queue the oldest request whose class has a free lane is.
    fn runnable(&self, state: &State) -> Option<usize> {
        state.queue.iter().position(|r| {
            let class = r.work.key().class();
            state.running[class] < self.lanes[class]
        })
    }

    /// The request at `at` and the queued ones of its kind, up to
    /// `max_bytes` (that one always, whatever its size).
    fn take(&self, state: &mut State, at: usize) -> Vec<Request> {
        let first = state.queue.remove(at).expect("a queued request");
        let key = first.work.key();
        let mut bytes = first.work.bytes();
        let mut batch = vec![first];
        let mut kept = VecDeque::with_capacity(state.queue.len());
        while let Some(request) = state.queue.pop_front() {
            let more = request.work.bytes();
            if request.work.key() == key && bytes + more <= self.max_bytes {
                bytes += more;
                batch.push(request);
            } else {
                kept.push_back(request);
            }
        }
        state.queue = kept;
        batch
    }

    /// Runs `batch` as one backend call and answers its requests; if the
    /// call unwinds, the guard answers them `Lost` and frees the lane.
    fn lead(&self, batch: Vec<Request>) {
        struct Guard<'b> {
            owner: &'b Batching,
            class: usize,
            ids: Vec<u64>,
            answers: Vec<Answer>,
        }
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                let mut state = self.owner.lock();
                state.running[self.class] -= 1;
                let mut answers = std::mem::take(&mut self.answers).into_iter();
                for &id in &self.ids {
                    state.answers.insert(id, answers.next().unwrap_or(Answer::Lost));
                }
                drop(state);
                self.owner.answered.notify_all();
            }
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        let mut guard = Guard {
            owner: self,
            class: batch[0].work.key().class(),
            ids: batch.iter().map(|r| r.id).collect(),
            answers: Vec::new(),
        };
        guard.answers = match batch[0].work.key() {
            Key::Seal(shape) => self.seal_batch(&shape, &batch),
            Key::Hash(algorithm) => self.hash_batch(algorithm, &batch),
        };
    }

    fn seal_batch(&self, shape: &Shape, batch: &[Request]) -> Vec<Answer> {
        // SAFETY: every request of the batch is unanswered, so its owner
        // is blocked in `submit` and lent these ranges (data shared,
        // parity mutably) for the call.
        let jobs = |spans: &mut dyn Iterator<Item = &(Span, Span)>| -> Vec<SealJob<'_>> {
            spans
                .map(|&(data, parity)| unsafe {
                    SealJob {
                        data: data.bytes(),
                        parity: parity.bytes_mut(),
                    }
                })
                .collect()
        };
        let counts: Vec<usize> = batch.iter().map(|r| r.stripes().len()).collect();
        let mut all = jobs(&mut batch.iter().flat_map(Request::stripes));
        let sealed = self.inner.seal(shape, &mut all);
        // The batch's borrows end here, before any retry borrows again.
        drop(all);
        match sealed {
            Ok(leaves) => {
                let mut leaves = leaves.into_iter();
                counts
                    .iter()
                    .map(|&n| Answer::Sealed(Ok(leaves.by_ref().take(n).collect())))
                    .collect()
            }
            // Each request again on its own, so that each gets its own error.
            Err(_) => batch
                .iter()
                .map(|r| Answer::Sealed(self.inner.seal(shape, &mut jobs(&mut r.stripes().iter()))))
                .collect(),
        }
    }

    fn hash_batch(&self, algorithm: Algorithm, batch: &[Request]) -> Vec<Answer> {
        // SAFETY: as in `seal_batch`; the inputs are only read.
        let inputs: Vec<&[u8]> = batch
            .iter()
            .flat_map(Request::spans)
            .map(|&s| unsafe { s.bytes() })
            .collect();
        let mut digests = self.inner.hash(algorithm, &inputs).into_iter();
        batch
            .iter()
            .map(|r| Answer::Hashed(digests.by_ref().take(r.spans().len()).collect()))
            .collect()
    }
}

impl Accelerator for Batching {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn detail(&self) -> String {
        let (calls, batches) = self.merged();
        let merged = format!("{calls} seal and hash calls in {batches} batches");
        match self.inner.detail() {
            detail if detail.is_empty() => merged,
            detail => format!("{detail}; {merged}"),
        }
    }

    fn seal(&self, shape: &Shape, jobs: &mut [SealJob<'_>]) -> Result<Vec<Leaves>, AccelError> {
        // A malformed request is refused here, alone.
        crate::check_seal_jobs(shape, jobs)?;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let spans = jobs
            .iter_mut()
            .map(|job| (Span::of(job.data), Span::of_mut(job.parity)))
            .collect();
        match self.submit(Asked::Seal(*shape, spans)) {
            Answer::Sealed(result) => result,
            Answer::Lost => Err(lost()),
            Answer::Hashed(_) => unreachable!("a seal is answered as one"),
        }
    }

    fn reconstruct(&self, shape: &Shape, jobs: &mut [ReconstructJob<'_>]) -> Result<Vec<Leaves>, AccelError> {
        self.inner.reconstruct(shape, jobs)
    }

    fn decode(&self, shape: &Shape, jobs: &mut [ReconstructJob<'_>]) -> Result<(), AccelError> {
        self.inner.decode(shape, jobs)
    }

    fn hash(&self, algorithm: Algorithm, inputs: &[&[u8]]) -> Vec<Digest> {
        if inputs.is_empty() {
            return Vec::new();
        }
        let spans = inputs.iter().map(|input| Span::of(input)).collect();
        match self.submit(Asked::Hash(algorithm, spans)) {
            Answer::Hashed(digests) => digests,
            // The batch's leader panicked: this caller's inputs are still
            // its own, so it hashes them itself.
            Answer::Lost => self.inner.hash(algorithm, inputs),
            Answer::Sealed(_) => unreachable!("a hash is answered as one"),
        }
    }

    fn host_memory(&self) -> Option<Arc<dyn crate::HostMemory>> {
        self.inner.host_memory()
    }

    fn prepare(&self, shape: &Shape) {
        self.inner.prepare(shape)
    }

    fn work(&self) -> Work {
        self.inner.work()
    }
}

fn lost() -> AccelError {
    AccelError::Unavailable {
        name: "batch".to_string(),
        why: "the thread running the batch this request was in panicked".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Cpu;
    use rand::{Rng, RngCore, SeedableRng};
    use std::sync::Barrier;
    use std::time::Duration;

    /// The CPU backend, slowed down and watched: each call sleeps, so that
    /// concurrent requests gather, and records how many stripes or inputs
    /// it was given.
    struct Watched {
        cpu: Cpu,
        sizes: Mutex<Vec<usize>>,
        delay: Duration,
        /// Panics on a seal of a stripe whose first data byte is this.
        poison: Option<u8>,
        /// Fails a seal of a stripe whose first data byte is this.
        refuse: Option<u8>,
    }

    impl Accelerator for Watched {
        fn name(&self) -> &str {
            "watched"
        }
        fn seal(&self, shape: &Shape, jobs: &mut [SealJob<'_>]) -> Result<Vec<Leaves>, AccelError> {
            self.sizes.lock().unwrap().push(jobs.len());
            std::thread::sleep(self.delay);
            if let Some(p) = self.poison {
                assert!(jobs.iter().all(|j| j.data[0] != p), "poisoned stripe");
            }
            if let Some(r) = self.refuse {
                if jobs.iter().any(|j| j.data[0] == r) {
                    return Err(AccelError::Unavailable {
                        name: "watched".to_string(),
                        why: "refused stripe".to_string(),
                    });
                }
            }
            self.cpu.seal(shape, jobs)
        }
        fn reconstruct(&self, shape: &Shape, jobs: &mut [ReconstructJob<'_>]) -> Result<Vec<Leaves>, AccelError> {
            self.cpu.reconstruct(shape, jobs)
        }
        fn decode(&self, shape: &Shape, jobs: &mut [ReconstructJob<'_>]) -> Result<(), AccelError> {
            self.cpu.decode(shape, jobs)
        }
        fn hash(&self, algorithm: Algorithm, inputs: &[&[u8]]) -> Vec<Digest> {
            self.sizes.lock().unwrap().push(inputs.len());
            std::thread::sleep(self.delay);
            self.cpu.hash(algorithm, inputs)
        }
        fn work(&self) -> Work {
            self.cpu.work()
        }
    }

    fn watched(delay_ms: u64, poison: Option<u8>) -> Arc<Watched> {
        Arc::new(Watched {
            cpu: Cpu::new(2),
            sizes: Mutex::new(Vec::new()),
            delay: Duration::from_millis(delay_ms),
            poison,
            refuse: None,
        })
    }

    /// Seals `stripes` stripes of random data through `accel`; returns the
    /// parity and leaves.
    fn seal_random(accel: &dyn Accelerator, shape: &Shape, stripes: usize, seed: u64) -> (Vec<Vec<u8>>, Vec<Leaves>) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let data: Vec<Vec<u8>> = (0..stripes)
            .map(|_| {
                let mut d = vec![0u8; shape.data * shape.chunk_bytes];
                rng.fill_bytes(&mut d);
                d
            })
            .collect();
        let mut parity = vec![vec![0u8; shape.parity * shape.chunk_bytes]; stripes];
        let mut jobs: Vec<SealJob> = data
            .iter()
            .zip(parity.iter_mut())
            .map(|(d, p)| SealJob { data: d, parity: p })
            .collect();
        let leaves = accel.seal(shape, &mut jobs).expect("seal");
        (parity, leaves)
    }

    #[test]
    fn concurrent_requests_are_merged_and_each_gets_exactly_its_own_results() {
        let inner = watched(20, None);
        let batching = Arc::new(Batching::new(inner.clone(), 1, DEFAULT_MAX_BYTES));
        let reference = Cpu::new(1);
        let shapes = [
            Shape::new(4, 2, 4096, Algorithm::Sha3_512),
            Shape::new(6, 3, 1000, Algorithm::Crc32c),
        ];
        let threads = 12;
        let start = Barrier::new(threads);
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (batching, reference, start, shapes) = (&batching, &reference, &start, &shapes);
                scope.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                    start.wait();
                    for round in 0..4u64 {
                        let seed = (t as u64) << 8 | round;
                        if rng.gen_bool(0.5) {
                            let shape = &shapes[rng.gen_range(0..2)];
                            let stripes = rng.gen_range(1..4);
                            let got = seal_random(batching.as_ref(), shape, stripes, seed);
                            assert_eq!(
                                got,
                                seal_random(reference, shape, stripes, seed),
                                "thread {t} round {round}"
                            );
                        } else {
                            let inputs: Vec<Vec<u8>> = (0..rng.gen_range(1..6))
                                .map(|_| (0..rng.gen_range(0..9000)).map(|_| rng.gen()).collect())
                                .collect();
                            let views: Vec<&[u8]> = inputs.iter().map(|i| &i[..]).collect();
                            let algorithm = [Algorithm::Sha3_512, Algorithm::Sha256][rng.gen_range(0..2)];
                            assert_eq!(batching.hash(algorithm, &views), reference.hash(algorithm, &views));
                        }
                    }
                });
            }
        });
        let (calls, batches) = batching.merged();
        assert_eq!(calls, (threads * 4) as u64);
        // Twelve threads behind one lane that sleeps 20 ms a call: most
        // requests find one running and gather behind it.
        assert!(batches * 2 <= calls, "{calls} requests ran as {batches} batches");
        assert!(inner.sizes.lock().unwrap().iter().any(|&n| n > 4));
    }

    #[test]
    fn a_batch_stops_at_max_bytes_and_a_lone_request_runs_at_once() {
        let inner = watched(30, None);
        let s = Shape::new(2, 1, 4096, Algorithm::Crc32c);
        // Room for two one-stripe requests (8 KiB of data each) a batch.
        let batching = Arc::new(Batching::new(inner.clone(), 1, 16 << 10));
        let started = std::time::Instant::now();
        seal_random(batching.as_ref(), &s, 1, 1);
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "a lone request waits for no timer"
        );
        inner.sizes.lock().unwrap().clear();
        std::thread::scope(|scope| {
            for t in 0..8 {
                let batching = &batching;
                scope.spawn(move || seal_random(batching.as_ref(), &s, 1, t));
            }
        });
        let sizes = inner.sizes.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 8);
        assert!(sizes.iter().all(|&n| n <= 2), "batches of {sizes:?}");
    }

    #[test]
    fn a_malformed_request_is_refused_alone() {
        let inner = watched(10, None);
        let batching = Arc::new(Batching::new(inner, 1, DEFAULT_MAX_BYTES));
        let s = Shape::new(4, 2, 4096, Algorithm::Crc32c);
        std::thread::scope(|scope| {
            for t in 0..6u64 {
                let batching = &batching;
                scope.spawn(move || {
                    if t == 3 {
                        let data = vec![0u8; 4 * 4096 - 1];
                        let mut parity = vec![0u8; 2 * 4096];
                        let mut jobs = [SealJob {
                            data: &data,
                            parity: &mut parity,
                        }];
                        let refused = batching.seal(&s, &mut jobs);
                        assert!(matches!(refused, Err(AccelError::WrongSize { .. })), "{refused:?}");
                    } else {
                        let reference = Cpu::new(1);
                        assert_eq!(
                            seal_random(batching.as_ref(), &s, 2, t),
                            seal_random(&reference, &s, 2, t)
                        );
                    }
                });
            }
        });
    }

    #[test]
    fn a_batch_that_fails_is_retried_request_by_request_so_only_the_bad_one_fails() {
        let inner = Arc::new(Watched {
            cpu: Cpu::new(2),
            sizes: Mutex::new(Vec::new()),
            delay: Duration::from_millis(20),
            poison: None,
            refuse: Some(0xCD),
        });
        let batching = Arc::new(Batching::new(inner.clone(), 1, DEFAULT_MAX_BYTES));
        let s = Shape::new(2, 1, 64, Algorithm::Crc32c);
        let reference = Cpu::new(1);
        let start = Barrier::new(8);
        type Outcome = (u8, Result<Vec<Leaves>, String>, Vec<u8>);
        let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8u8)
                .map(|t| {
                    let (batching, start) = (&batching, &start);
                    scope.spawn(move || {
                        let mut data = vec![t.wrapping_mul(37); 128];
                        data[0] = if t == 5 { 0xCD } else { t };
                        let mut parity = vec![0u8; 64];
                        start.wait();
                        let mut jobs = [SealJob {
                            data: &data,
                            parity: &mut parity,
                        }];
                        let result = batching.seal(&s, &mut jobs).map_err(|e| e.to_string());
                        (t, result, data)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("no panic")).collect()
        });
        for (t, result, data) in outcomes {
            if t == 5 {
                assert!(result.is_err(), "the refused stripe fails");
            } else {
                let mut parity = vec![0u8; 64];
                let want = reference
                    .seal(
                        &s,
                        &mut [SealJob {
                            data: &data,
                            parity: &mut parity,
                        }],
                    )
                    .expect("reference");
                assert_eq!(result.expect("the others are sealed"), want, "thread {t}");
            }
        }
        // Some batch held the refused stripe with others (8 threads, one
        // lane, 20 ms a call), and was run again one request at a time.
        let sizes = inner.sizes.lock().unwrap().clone();
        assert!(sizes.iter().any(|&n| n > 1), "batches of {sizes:?}");
        assert!(sizes.iter().sum::<usize>() > 8, "a failed batch was retried: {sizes:?}");
    }

    #[test]
    fn a_leader_that_panics_answers_its_batch_with_an_error_and_frees_its_lane() {
        let inner = watched(20, Some(0xAB));
        let batching = Arc::new(Batching::new(inner, 1, DEFAULT_MAX_BYTES));
        let s = Shape::new(2, 1, 64, Algorithm::Crc32c);
        let outcomes: Vec<Result<bool, ()>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8u8)
                .map(|t| {
                    let batching = &batching;
                    scope.spawn(move || {
                        let mut data = vec![t; 128];
                        data[0] = if t == 0 { 0xAB } else { t };
                        let mut parity = vec![0u8; 64];
                        let mut jobs = [SealJob {
                            data: &data,
                            parity: &mut parity,
                        }];
                        batching.seal(&s, &mut jobs).is_ok()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().map_err(|_| ())).collect()
        });
        // The poisoned stripe's batch unwound (in whichever thread led it),
        // every other thread returned, and the lane is free again.
        assert!(outcomes.iter().any(|o| !matches!(o, Ok(true))), "{outcomes:?}");
        let reference = Cpu::new(1);
        assert_eq!(
            seal_random(batching.as_ref(), &s, 1, 9),
            seal_random(&reference, &s, 1, 9)
        );
    }

    /// A backend whose seal waits (up to 5 s) for a hash to be run beside it.
    #[derive(Default)]
    struct Gate {
        state: Mutex<(bool, bool)>, // (sealing, hashed)
        changed: std::sync::Condvar,
    }

    impl Accelerator for Gate {
        fn name(&self) -> &str {
            "gate"
        }
        fn seal(&self, shape: &Shape, jobs: &mut [SealJob<'_>]) -> Result<Vec<Leaves>, AccelError> {
            let mut state = self.state.lock().unwrap();
            state.0 = true;
            self.changed.notify_all();
            let (state, _) = self
                .changed
                .wait_timeout_while(state, Duration::from_secs(5), |s| !s.1)
                .unwrap();
            assert!(state.1, "a hash ran while the seal batch held its lane");
            drop(state);
            Cpu::new(1).seal(shape, jobs)
        }
        fn reconstruct(&self, _: &Shape, _: &mut [ReconstructJob<'_>]) -> Result<Vec<Leaves>, AccelError> {
            unreachable!()
        }
        fn decode(&self, _: &Shape, _: &mut [ReconstructJob<'_>]) -> Result<(), AccelError> {
            unreachable!()
        }
        fn hash(&self, algorithm: Algorithm, inputs: &[&[u8]]) -> Vec<Digest> {
            self.state.lock().unwrap().1 = true;
            self.changed.notify_all();
            inputs.iter().map(|i| algorithm.digest(i)).collect()
        }
        fn work(&self) -> Work {
            Work::default()
        }
    }

    #[test]
    fn a_hash_does_not_wait_for_a_lane_behind_seals() {
        // One lane: a client write's hashes must not queue behind a seal
        // batch that is running (on a GPU, milliseconds).
        let gate = Arc::new(Gate::default());
        let batching = Batching::new(gate.clone(), 1, DEFAULT_MAX_BYTES);
        let shape = Shape::new(2, 1, 64, Algorithm::Crc32c);
        std::thread::scope(|scope| {
            let sealer = scope.spawn(|| {
                let data = vec![1u8; 128];
                let mut parity = vec![0u8; 64];
                let mut jobs = [SealJob {
                    data: &data,
                    parity: &mut parity,
                }];
                batching.seal(&shape, &mut jobs).map(|_| ())
            });
            let state = gate.state.lock().unwrap();
            let state = gate
                .changed
                .wait_timeout_while(state, Duration::from_secs(5), |s| !s.0)
                .unwrap()
                .0;
            assert!(state.0, "the seal started");
            drop(state);
            let digests = batching.hash(Algorithm::Sha256, &[b"write"]);
            assert_eq!(digests, vec![Algorithm::Sha256.digest(b"write")]);
            sealer.join().unwrap().unwrap();
        });
    }

    /// A backend whose hashes wait (up to 5 s) until two run at once.
    #[derive(Default)]
    struct Pair {
        state: Mutex<(usize, usize)>, // (running, most at once)
        changed: std::sync::Condvar,
    }

    impl Accelerator for Pair {
        fn name(&self) -> &str {
            "pair"
        }
        fn seal(&self, _: &Shape, _: &mut [SealJob<'_>]) -> Result<Vec<Leaves>, AccelError> {
            unreachable!()
        }
        fn reconstruct(&self, _: &Shape, _: &mut [ReconstructJob<'_>]) -> Result<Vec<Leaves>, AccelError> {
            unreachable!()
        }
        fn decode(&self, _: &Shape, _: &mut [ReconstructJob<'_>]) -> Result<(), AccelError> {
            unreachable!()
        }
        fn hash(&self, algorithm: Algorithm, inputs: &[&[u8]]) -> Vec<Digest> {
            let mut state = self.state.lock().unwrap();
            state.0 += 1;
            state.1 = state.1.max(state.0);
            self.changed.notify_all();
            let (mut state, _) = self
                .changed
                .wait_timeout_while(state, Duration::from_secs(5), |s| s.1 < 2)
                .unwrap();
            state.0 -= 1;
            inputs.iter().map(|i| algorithm.digest(i)).collect()
        }
        fn work(&self) -> Work {
            Work::default()
        }
    }

    #[test]
    fn hashes_have_lanes_of_their_own_number() {
        // One seal lane, two hash lanes: a write's hashes asked for while
        // another write's run go to the backend beside them (on a GPU, a
        // hash launch takes milliseconds however small).
        let pair = Arc::new(Pair::default());
        let batching = Batching::new(pair.clone(), 1, DEFAULT_MAX_BYTES).with_hash_lanes(2);
        std::thread::scope(|scope| {
            let first = scope.spawn(|| batching.hash(Algorithm::Sha256, &[b"first"]));
            let state = pair.state.lock().unwrap();
            let state = pair
                .changed
                .wait_timeout_while(state, Duration::from_secs(5), |s| s.0 == 0)
                .unwrap()
                .0;
            assert_eq!(state.0, 1, "the first hash started");
            drop(state);
            let second = batching.hash(Algorithm::Sha256, &[b"second"]);
            assert_eq!(second, vec![Algorithm::Sha256.digest(b"second")]);
            assert_eq!(first.join().unwrap(), vec![Algorithm::Sha256.digest(b"first")]);
        });
        assert_eq!(pair.state.lock().unwrap().1, 2, "two hash batches ran at once");
        assert_eq!(batching.merged(), (2, 2));
    }
}
