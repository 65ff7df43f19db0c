//! The server's workers: a fixed number of threads, shared by every
//! connection, that carry out requests. Jobs are taken in the order they
//! came, from whichever connection. A job never waits on a client (the
//! reply goes to the connection's writer thread), so a client that stops
//! reading cannot tie workers up; each connection's share is bounded by
//! its in-flight limits (`transmit`).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send>;

pub(crate) struct Pool {
    jobs: Sender<Job>,
}

impl Pool {
    /// `threads` workers, which end when the pool is dropped and the jobs
    /// queued are done.
    pub fn new(threads: usize) -> Pool {
        let (jobs, queue) = channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("nbd-worker-{i}"))
                .spawn(move || work(&queue))
                .expect("spawning an NBD worker thread");
        }
        Pool { jobs }
    }

    pub fn submit(&self, job: impl FnOnce() + Send + 'static) {
        // The workers live as long as the sender: this cannot fail.
        self.jobs.send(Box::new(job)).expect("the NBD workers outlive the pool");
    }
}

fn work(queue: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let queue = queue.lock().unwrap_or_else(|p| p.into_inner());
            match queue.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        job();
    }
}
