//! A whole client conversation from arbitrary bytes: the server, with an
//! export in memory, reads the input as everything a client sent, over a
//! socket pair, and must answer or drop it without panicking or hanging.
#![no_main]

use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use tessera_nbd::{Export, Failure, Limits, Server};

/// An export that keeps nothing: the server's handling of what clients
/// send is under test, not storage.
struct Null;

impl Export for Null {
    fn size(&self) -> u64 {
        1 << 20
    }
    fn read(&self, _offset: u64, buf: &mut [u8]) -> Result<(), Failure> {
        buf.fill(0);
        Ok(())
    }
    fn write(&self, _offset: u64, _bytes: &[u8], _fua: bool) -> Result<(), Failure> {
        Ok(())
    }
    fn flush(&self) -> Result<(), Failure> {
        Ok(())
    }
    fn trim(&self, _offset: u64, _len: u64, _fua: bool) -> Result<(), Failure> {
        Ok(())
    }
    fn write_zeroes(&self, _offset: u64, _len: u64, _fua: bool) -> Result<(), Failure> {
        Ok(())
    }
}

fn server() -> &'static Server<Null> {
    static SERVER: OnceLock<Server<Null>> = OnceLock::new();
    SERVER.get_or_init(|| {
        let limits = Limits {
            workers: 4,
            ..Limits::default()
        };
        Server::new(Arc::new(Null), "tessera".into(), String::new(), limits)
    })
}

fuzz_target!(|data: &[u8]| {
    let (mut client, server_end) = std::os::unix::net::UnixStream::pair().unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let served = scope.spawn(|| server().serve(server_end, &stop));
        // The server's replies are drained as they come, so it never
        // waits on a full socket.
        let mut reader = client.try_clone().unwrap();
        let drain = scope.spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        let _ = client.write_all(data);
        let _ = client.shutdown(std::net::Shutdown::Write);
        let _ = served.join().expect("the server panicked");
        let _ = client.shutdown(std::net::Shutdown::Both);
        let _ = drain.join();
    });
});
