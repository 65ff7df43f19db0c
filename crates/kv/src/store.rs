//! The KV spaces of an open array: each in its own thin volume, named
//! `kv.` and the space's name (so `tessera volume list` shows them, with
//! the space each takes), and one thread that does their deferred work,
//! a space at a time, at low CPU priority.

use crate::cache::{BatchCache, CacheStatus};
use crate::schema::SpaceSchema;
use crate::space::{Space, SpaceStatus};
use crate::KvError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;
use tessera_array::volume::{VOLUME_BYTES_MAX, VOLUME_NAME_BYTES_MAX};
use tessera_array::{Array, ArrayError};

/// A space's volume is this prefix and its name.
pub const VOLUME_PREFIX: &str = "kv.";
pub const SPACE_NAME_BYTES_MAX: usize = VOLUME_NAME_BYTES_MAX - VOLUME_PREFIX.len();

#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Bytes of records a sort holds in memory at once (a run's size).
    pub sort_memory: usize,
    /// Whether a thread does the deferred work as soon as a space is
    /// finalized (else only `Store::work_all` does it).
    pub background: bool,
    /// Bytes a second the background work writes at most while clients
    /// make requests (`None`: it never yields).
    pub busy_rate: Option<u64>,
    /// Bytes of decoded table batches kept for queries, all spaces
    /// together (`cache.rs`; 0: none).
    pub cache_bytes: usize,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            sort_memory: 256 << 20,
            background: true,
            busy_rate: Some(64 << 20),
            cache_bytes: 256 << 20,
        }
    }
}

pub struct Store {
    array: Arc<Array>,
    options: StoreOptions,
    spaces: Mutex<BTreeMap<String, Arc<Space>>>,
    /// The worker's: stop, and a flag a finalize sets to wake it.
    stop: AtomicBool,
    wake: (Mutex<bool>, Condvar),
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The last error of each space's deferred work, for `status`.
    errors: Mutex<BTreeMap<String, String>>,
    /// Spaces whose volume could not be opened as one, and why: the
    /// others are served.
    broken: BTreeMap<String, String>,
    cache: Arc<BatchCache>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn valid_name(name: &str) -> bool {
    name.len() <= SPACE_NAME_BYTES_MAX && tessera_array::volume::valid_name(name) && !name.contains(':')
}

impl Store {
    /// Opens every space of `array` (their logs recovered) and, with
    /// `options.background`, starts the worker.
    pub fn open(array: Arc<Array>, options: StoreOptions) -> Result<Arc<Store>, KvError> {
        let (mut spaces, mut broken) = (BTreeMap::new(), BTreeMap::new());
        let cache = Arc::new(BatchCache::new(options.cache_bytes));
        for volume in array.volumes() {
            if let Some(name) = volume.name.strip_prefix(VOLUME_PREFIX) {
                match Space::open(name, array.volume(&volume.name)?, cache.clone()) {
                    Ok(space) => {
                        spaces.insert(name.to_string(), Arc::new(space));
                    }
                    Err(e @ (KvError::Corrupt { .. } | KvError::BadSchema { .. })) => {
                        broken.insert(name.to_string(), e.to_string());
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        let store = Arc::new(Store {
            array,
            options,
            spaces: Mutex::new(spaces),
            stop: AtomicBool::new(false),
            wake: (Mutex::new(true), Condvar::new()),
            worker: Mutex::new(None),
            errors: Mutex::new(BTreeMap::new()),
            broken,
            cache,
        });
        if store.options.background {
            let worker = store.clone();
            let handle = std::thread::Builder::new()
                .name("kv-sort".into())
                .spawn(move || worker.run_worker())
                .map_err(|e| {
                    KvError::Array(ArrayError::ThreadStart {
                        what: "kv-sort",
                        source: e,
                    })
                })?;
            *lock(&store.worker) = Some(handle);
        }
        Ok(store)
    }

    /// Creates a space: its volume and its manifest.
    pub fn create(&self, name: &str, schema: SpaceSchema) -> Result<Arc<Space>, KvError> {
        if !valid_name(name) {
            return Err(KvError::BadName { name: name.to_string() });
        }
        schema.check()?;
        let mut spaces = lock(&self.spaces);
        if spaces.contains_key(name) {
            return Err(KvError::SpaceExists { name: name.to_string() });
        }
        let volume_name = format!("{VOLUME_PREFIX}{name}");
        let volume = match self.array.create_volume(&volume_name, VOLUME_BYTES_MAX) {
            Err(ArrayError::VolumeExists { .. }) => return Err(KvError::SpaceExists { name: name.to_string() }),
            other => other?,
        };
        let space = match Space::create(name, volume, schema, self.cache.clone()) {
            Ok(space) => Arc::new(space),
            Err(e) => {
                // No half-made space: its volume goes with the failure.
                let _ = self.array.delete_volume(&volume_name);
                return Err(e);
            }
        };
        spaces.insert(name.to_string(), space.clone());
        Ok(space)
    }

    /// Spaces that could not be opened, and why.
    pub fn broken(&self) -> &BTreeMap<String, String> {
        &self.broken
    }

    pub fn space(&self, name: &str) -> Result<Arc<Space>, KvError> {
        if let Some(why) = self.broken.get(name) {
            return Err(KvError::Corrupt {
                why: format!("space {name:?} could not be opened: {why}"),
            });
        }
        lock(&self.spaces)
            .get(name)
            .cloned()
            .ok_or_else(|| KvError::UnknownSpace { name: name.to_string() })
    }

    /// Finalizes a space and wakes the worker for its deferred work.
    pub fn finalize(&self, name: &str) -> Result<bool, KvError> {
        let finalized = self.space(name)?.finalize()?;
        *lock(&self.wake.0) = true;
        self.wake.1.notify_all();
        Ok(finalized)
    }

    /// Deletes a space and its volume (its space is freed by the array's
    /// garbage collection).
    pub fn drop_space(&self, name: &str) -> Result<(), KvError> {
        let space = lock(&self.spaces)
            .remove(name)
            .ok_or_else(|| KvError::UnknownSpace { name: name.to_string() })?;
        let result = self.array.delete_volume(&format!("{VOLUME_PREFIX}{name}"));
        if result.is_err() {
            lock(&self.spaces).insert(name.to_string(), space);
        } else {
            // Its tables go with it (unless a query under way still holds
            // them: their batches are then pushed out in time).
            drop(space);
            self.cache.forget_gone();
        }
        lock(&self.errors).remove(name);
        Ok(result?)
    }

    pub fn list(&self) -> Vec<SpaceStatus> {
        let spaces: Vec<Arc<Space>> = lock(&self.spaces).values().cloned().collect();
        spaces.iter().map(|s| s.status()).collect()
    }

    /// The batch cache's budget, use and hits.
    pub fn cache(&self) -> CacheStatus {
        self.cache.status()
    }

    /// The last error of a space's deferred work, if it failed.
    pub fn work_error(&self, name: &str) -> Option<String> {
        lock(&self.errors).get(name).cloned()
    }

    /// Does every space's deferred work now, on this thread.
    pub fn work_all(&self) -> Result<(), KvError> {
        let spaces: Vec<Arc<Space>> = lock(&self.spaces).values().cloned().collect();
        for space in spaces.iter().filter(|s| s.has_work()) {
            space.work(
                self.options.sort_memory,
                &|| self.stop.load(Ordering::Relaxed),
                &mut |_| {},
            )?;
        }
        Ok(())
    }

    fn run_worker(&self) {
        // Below clients' threads: sorting takes the cores they leave.
        // SAFETY: setpriority on this thread's own id changes nothing else.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10);
        }
        let mut pace = crate::pace::Pace::new(|| self.array.client_requests(), self.options.busy_rate);
        while !self.stop.load(Ordering::Relaxed) {
            let spaces: Vec<Arc<Space>> = lock(&self.spaces).values().cloned().collect();
            for space in spaces.iter().filter(|s| s.has_work()) {
                let stop = || self.stop.load(Ordering::Relaxed);
                match space.work(self.options.sort_memory, &stop, &mut |bytes| pace.moved(bytes)) {
                    Ok(()) => {
                        lock(&self.errors).remove(space.name());
                    }
                    Err(KvError::Stopped) => return,
                    // A space dropped while it was sorted fails: not an
                    // error of a space that is.
                    Err(_) if !lock(&self.spaces).contains_key(space.name()) => {}
                    Err(e) => {
                        lock(&self.errors).insert(space.name().to_string(), e.to_string());
                    }
                }
            }
            let mut woken = lock(&self.wake.0);
            if !*woken {
                // A space whose work failed is tried again a while later.
                woken = self
                    .wake
                    .1
                    .wait_timeout(woken, Duration::from_secs(5))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            *woken = false;
        }
    }

    /// Stops the worker (a sort under way goes on at the next opening).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        *lock(&self.wake.0) = true;
        self.wake.1.notify_all();
        if let Some(handle) = lock(&self.worker).take() {
            let _ = handle.join();
        }
    }
}
