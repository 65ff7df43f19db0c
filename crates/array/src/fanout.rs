//! Threads that run the chunk reads of one request side by side: each
//! blocks on a member, and while there is nothing to do it sleeps on a
//! condvar. The engine's rayon pool (`Stripes::io_pool`) spins and yields
//! before it sleeps, as a compute pool should: handed the two or three
//! chunk reads of a 128 KiB read, its wake-ups cost ~0.3 ms of CPU a read
//! on two cores (docs/PERFORMANCE.md, "The I/O pool's wake-ups"); here a
//! job costs a futex wake.
//!
//! # Guarantees
//!
//! - `run` returns only once every job it handed out has ended, panicked
//!   or not: the workers borrow the caller's jobs and closure, and touch
//!   neither after the job ends.
//! - Each job runs once, on one thread: the first on the caller's, as
//!   many of the others as there are idle workers on those, the rest on
//!   the caller's too (under load, side by side costs more than it
//!   gives), each element of the slice borrowed mutably by that thread
//!   alone. A caller waiting for its own runs what is queued, its own or
//!   others', before it sleeps.
//! - A panic in a job is raised again in the caller, after every job
//!   ended.
//!
//! Jobs must not fan out again on the same pool (a worker waiting for
//! jobs queued behind its own could wait for ever): only leaf work, reads
//! that wait on members, goes here. The rebuild, which reads stripes that
//! each read chunks, runs its stripes on the rayon pool.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

pub(crate) struct Fanout {
    shared: Arc<Queue>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

struct Queue {
    tasks: Mutex<Tasks>,
    ready: Condvar,
}

struct Tasks {
    waiting: VecDeque<Task>,
    /// Workers asleep, waiting for a job.
    idle: usize,
    stop: bool,
}

/// One job handed to a worker: which element, and its fan-out.
struct Task {
    batch: Arc<Batch>,
    index: usize,
}

/// What a fan-out's jobs share: the caller's closure, and how many of
/// them are still running. Held in an `Arc`, so that a worker's last
/// touch of the count (its unlock) never outlives it; the closure it
/// points at is the caller's, used only while its job runs.
struct Batch {
    run: *const (dyn Fn(usize) + Sync),
    left: Mutex<usize>,
    done: Condvar,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `run` points at a `Sync` closure that `Fanout::run` keeps alive,
// and does not return from, until every job that calls it has ended.
unsafe impl Send for Batch {}
unsafe impl Sync for Batch {}

/// The caller's slice, for the closure that hands out its elements.
struct Elements<T>(*mut T);

// SAFETY: each element goes to one thread (a job runs once), which is
// what `T: Send` allows; the pointer itself is only copied.
unsafe impl<T: Send> Sync for Elements<T> {}
unsafe impl<T: Send> Send for Elements<T> {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Fanout {
    /// `threads` workers named `name-N`.
    pub fn start(threads: usize, name: &str) -> std::io::Result<Fanout> {
        let shared = Arc::new(Queue {
            tasks: Mutex::new(Tasks {
                waiting: VecDeque::new(),
                idle: 0,
                stop: false,
            }),
            ready: Condvar::new(),
        });
        let mut fanout = Fanout {
            shared,
            threads: Vec::with_capacity(threads),
        };
        for i in 0..threads {
            let queue = fanout.shared.clone();
            let thread = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || work(&queue))?;
            fanout.threads.push(thread);
        }
        Ok(fanout)
    }

    /// Runs `each` on every element of `jobs`: the first on this thread,
    /// as many others as there are idle workers on those, the rest on
    /// this thread too; returns once all have ended.
    pub fn run<T: Send>(&self, jobs: &mut [T], each: impl Fn(&mut T) + Sync) {
        if jobs.len() < 2 || self.threads.is_empty() {
            jobs.iter_mut().for_each(each);
            return;
        }
        let count = jobs.len();
        let elements = Elements(jobs.as_mut_ptr());
        let call = move |i: usize| {
            let elements = &elements;
            assert!(i < count);
            // SAFETY: `i` is in the slice, and each index is run once, so
            // this is the only reference to element `i`; the slice
            // outlives every job (`run` waits for them).
            each(unsafe { &mut *elements.0.add(i) })
        };
        let run: &(dyn Fn(usize) + Sync + '_) = &call;
        // SAFETY: only the lifetime is erased; the batch's jobs all end
        // before `call` goes out of scope (the wait below).
        let run: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(run) };
        // Handed out only to workers that would otherwise sleep: when all
        // are busy (many requests at once) the caller reads its own chunks
        // one after the other, which costs no wake-up and no queueing
        // behind other requests' jobs.
        let (batch, handed) = {
            let mut tasks = lock(&self.shared.tasks);
            let handed = (count - 1).min(tasks.idle.saturating_sub(tasks.waiting.len()));
            let batch = Arc::new(Batch {
                run,
                left: Mutex::new(handed),
                done: Condvar::new(),
                panic: Mutex::new(None),
            });
            for index in 1..=handed {
                tasks.waiting.push_back(Task {
                    batch: batch.clone(),
                    index,
                });
            }
            (batch, handed)
        };
        for _ in 0..handed {
            self.shared.ready.notify_one();
        }
        // Every job runs, whichever panics (as the workers' do).
        let mut first = Ok(());
        for index in std::iter::once(0).chain(handed + 1..count) {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| call(index))) {
                if first.is_ok() {
                    first = Err(panic);
                }
            }
        }
        // While jobs wait in the queue (this fan-out's, or others'), this
        // thread runs them rather than sleep: under load the workers are
        // busy, and a wake-up each would cost more. Then it waits for
        // those of its own the workers took.
        while *lock(&batch.left) > 0 {
            let Some(task) = lock(&self.shared.tasks).waiting.pop_front() else {
                break;
            };
            execute(task);
        }
        let mut left = lock(&batch.left);
        while *left > 0 {
            left = batch.done.wait(left).unwrap_or_else(|p| p.into_inner());
        }
        drop(left);
        if let Err(panic) = first {
            resume_unwind(panic);
        }
        let panicked = lock(&batch.panic).take();
        if let Some(panic) = panicked {
            resume_unwind(panic);
        }
    }
}

/// A worker: takes jobs until the pool stops.
fn work(queue: &Queue) {
    loop {
        let task = {
            let mut tasks = lock(&queue.tasks);
            loop {
                if let Some(task) = tasks.waiting.pop_front() {
                    break task;
                }
                if tasks.stop {
                    return;
                }
                tasks.idle += 1;
                tasks = queue.ready.wait(tasks).unwrap_or_else(|p| p.into_inner());
                tasks.idle -= 1;
            }
        };
        execute(task);
    }
}

/// Runs one job, then counts it done.
fn execute(task: Task) {
    let batch = &task.batch;
    // SAFETY: the caller of `run` waits for this job to end before the
    // closure goes away; `left` is counted down only after it.
    let run = unsafe { &*batch.run };
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| run(task.index))) {
        lock(&batch.panic).get_or_insert(panic);
    }
    let mut left = lock(&batch.left);
    *left -= 1;
    if *left == 0 {
        batch.done.notify_all();
    }
}

impl Drop for Fanout {
    fn drop(&mut self) {
        lock(&self.shared.tasks).stop = true;
        self.shared.ready.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    use std::time::Duration;

    impl Fanout {
        /// Returns once every worker waits for a job (a pool just started
        /// hands nothing out until its workers got there).
        fn wait_idle(&self) {
            for _ in 0..2000 {
                if lock(&self.shared.tasks).idle == self.threads.len() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            panic!("the workers never waited for a job");
        }
    }

    /// Jobs handed to idle workers run there, side by side with the
    /// caller's (not all on the caller's thread).
    #[test]
    fn idle_workers_take_jobs_side_by_side() {
        let fanout = Fanout::start(4, "test-fanout").unwrap();
        fanout.wait_idle();
        let mut jobs: Vec<Option<std::thread::ThreadId>> = vec![None; 4];
        fanout.run(&mut jobs, |ran_on| {
            std::thread::sleep(Duration::from_millis(100));
            *ran_on = Some(std::thread::current().id());
        });
        let threads: std::collections::HashSet<_> = jobs.iter().map(|t| t.expect("every job ran")).collect();
        assert!(
            threads.len() >= 2,
            "four jobs of 100 ms ran on {} thread",
            threads.len()
        );
    }

    /// Many callers at once, fan-outs of every size up to past the
    /// workers', some jobs slow enough that workers still hold them when
    /// the caller's own are done: every element is taken once and only
    /// once, and done when `run` returns (a job that ran twice, not at
    /// all, or after `run` returned, shows in the counts).
    #[test]
    fn every_job_runs_once_whoever_runs_it() {
        let fanout = Fanout::start(4, "test-fanout").unwrap();
        fanout.wait_idle();
        std::thread::scope(|scope| {
            for caller in 0..6u64 {
                let fanout = &fanout;
                scope.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(caller);
                    for _ in 0..200 {
                        let n = rng.gen_range(0..12);
                        let mut jobs: Vec<(u64, u32)> = (0..n).map(|i| (i, 0)).collect();
                        fanout.run(&mut jobs, |(value, runs)| {
                            *runs += 1;
                            if *value % 2 == 1 {
                                std::thread::sleep(Duration::from_micros(200));
                            }
                            *value *= 3;
                        });
                        for (i, &(value, runs)) in jobs.iter().enumerate() {
                            assert_eq!((value, runs), (i as u64 * 3, 1), "caller {caller}, job {i} of {n}");
                        }
                    }
                });
            }
        });
    }

    /// A job that panics, on the caller's thread or a worker's: the panic
    /// reaches the caller once every other job ended (those the workers
    /// hold, here, the slowest), and the pool goes on.
    #[test]
    fn a_panic_reaches_the_caller_after_every_job_ended() {
        let fanout = Fanout::start(3, "test-fanout").unwrap();
        for bad in [0usize, 1, 5] {
            fanout.wait_idle();
            let mut jobs: Vec<(usize, bool)> = (0..8).map(|i| (i, false)).collect();
            let result = catch_unwind(AssertUnwindSafe(|| {
                fanout.run(&mut jobs, |(i, ended)| {
                    if *i == bad {
                        panic!("job {i}");
                    }
                    // Jobs 1 to 3 go to the three idle workers.
                    let ms = if (1..=3).contains(i) { 30 } else { 1 };
                    std::thread::sleep(Duration::from_millis(ms));
                    *ended = true;
                })
            }));
            assert!(result.is_err(), "job {bad}'s panic was lost");
            assert!(
                jobs.iter().all(|&(i, ended)| ended || i == bad),
                "a job was still running when the panic came out"
            );
        }
        let mut jobs = vec![1u8; 5];
        fanout.run(&mut jobs, |x| *x += 1);
        assert_eq!(jobs, vec![2u8; 5]);
    }
}
