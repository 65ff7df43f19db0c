//! A whole client conversation from arbitrary bytes: the server, with an
//! export in memory, reads the input as everything a client sent, over a
//! socket pair, and must answer or drop it without panicking or hanging.
#![no_main]

use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use tessera_nbd::{Export, Failure, Limits, Server};

struct Memory(Mutex<Vec<u8>>);

impl Export for Memory {
    fn size(&self) -> u64 {
        1 << 20
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Failure> {
        let data = self.0.lock().unwrap();
        buf.copy_from_slice(&data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, bytes: &[u8], _fua: bool) -> Result<(), Failure> {
        self.0.lock().unwrap()[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
    fn flush(&self) -> Result<(), Failure> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure> {
        self.write_zeroes(offset, len, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, _fua: bool) -> Result<(), Failure> {
        self.0.lock().unwrap()[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
}

fn server() -> &'static Server<Memory> {
    static SERVER: OnceLock<Server<Memory>> = OnceLock::new();
    SERVER.get_or_init(|| {
        let limits = Limits {
            workers: 4,
            ..Limits::default()
        };
        Server::new(
            Arc::new(Memory(Mutex::new(vec![0; 1 << 20]))),
            "tessera".into(),
            String::new(),
            limits,
        )
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
