//! How the deferred work yields to clients: after each piece of work it
//! reports the bytes it moved, and while the array's clients made
//! requests since the last report, it sleeps so as to move at most
//! `busy_rate` bytes a second; with no client about, it runs flat out.
//! (Its own requests go through a background volume handle and are not
//! counted as clients'.)

use std::time::{Duration, Instant};

/// The longest one sleep: the work stays responsive to `stop`.
const SLEEP_MAX: Duration = Duration::from_millis(250);

pub struct Pace<F: FnMut() -> u64> {
    /// Client requests so far (the array's count).
    requests: F,
    seen: u64,
    busy_rate: Option<u64>,
    next: Instant,
}

impl<F: FnMut() -> u64> Pace<F> {
    pub fn new(mut requests: F, busy_rate: Option<u64>) -> Pace<F> {
        Pace {
            seen: requests(),
            requests,
            busy_rate: busy_rate.filter(|&r| r > 0),
            next: Instant::now(),
        }
    }

    /// `bytes` more were moved: sleeps as long as clients were about and
    /// the work is ahead of the busy rate.
    pub fn moved(&mut self, bytes: u64) {
        let requests = (self.requests)();
        let busy = requests != self.seen;
        self.seen = requests;
        let now = Instant::now();
        let Some(rate) = self.busy_rate.filter(|_| busy) else {
            self.next = now;
            return;
        };
        self.next = self.next.max(now) + Duration::from_secs_f64(bytes as f64 / rate as f64);
        if let Some(ahead) = self.next.checked_duration_since(now) {
            std::thread::sleep(ahead.min(SLEEP_MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_slows_to_the_busy_rate_only_while_clients_are_about() {
        // Idle: 64 MiB at 64 MiB/s takes no time.
        let mut idle = Pace::new(|| 7, Some(64 << 20));
        let start = Instant::now();
        for _ in 0..64 {
            idle.moved(1 << 20);
        }
        assert!(start.elapsed() < Duration::from_millis(50), "{:?}", start.elapsed());
        // Busy (the count moves each time): 16 MiB at 64 MiB/s, 250 ms.
        let mut count = 0;
        let mut busy = Pace::new(
            || {
                count += 1;
                count
            },
            Some(64 << 20),
        );
        let start = Instant::now();
        for _ in 0..16 {
            busy.moved(1 << 20);
        }
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
}
