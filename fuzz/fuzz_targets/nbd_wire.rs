//! The NBD wire codec on arbitrary bytes: the first byte picks a parser,
//! the rest is its input. Every parser must return a value or a typed
//! error, never panic; what parses must encode back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_nbd::wire::{self, ClientOption, OptionHeader, RequestHeader};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            if let Ok(bytes) = rest.get(..4).unwrap_or_default().try_into() {
                let _ = wire::parse_client_flags(bytes);
            }
        }
        1 => {
            // An option header, then its data.
            let Some(header) = rest.get(..OptionHeader::BYTES) else {
                return;
            };
            let Ok(header) = OptionHeader::parse(header.try_into().unwrap()) else {
                return;
            };
            let data = &rest[OptionHeader::BYTES..];
            if let Ok(option) = ClientOption::parse(header.option, data) {
                if !matches!(option, ClientOption::Unknown(_) | ClientOption::Abort) {
                    assert_eq!(&option.encode()[OptionHeader::BYTES..], data);
                }
            }
        }
        2 => {
            // A request header, checked against a size from the input.
            let Some(raw) = rest.get(..RequestHeader::BYTES) else {
                return;
            };
            let size = rest
                .get(RequestHeader::BYTES..RequestHeader::BYTES + 8)
                .map_or(1 << 30, |b| u64::from_le_bytes(b.try_into().unwrap()));
            if let Ok(header) = RequestHeader::parse(raw.try_into().unwrap()) {
                assert_eq!(&header.encode()[..], raw);
                let _ = header.check(size, size % 2 == 0);
            }
        }
        _ => {
            // Block status runs: (bytes, flags) pairs, then a length.
            let runs: Vec<(u64, u32)> = rest
                .chunks_exact(6)
                .map(|c| {
                    (
                        u64::from(u32::from_le_bytes(c[..4].try_into().unwrap())),
                        u32::from(c[4] % 4),
                    )
                })
                .collect();
            let len = rest.len() as u32 * 977 + 1;
            let descriptors = wire::block_status_descriptors(&runs, len, which & 4 != 0);
            assert!(!descriptors.is_empty() && descriptors.iter().all(|d| d.0 > 0));
            assert!(descriptors.iter().map(|d| u64::from(d.0)).sum::<u64>() <= u64::from(len));
            let _ = wire::block_status_chunk(1, &descriptors);
        }
    }
});
