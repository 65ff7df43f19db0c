//! Opening an array from devices in any order: which array most of them
//! belong to, which are its members, and which are left out and why.

use crate::device::Device;
use crate::engine::Array;
use crate::error::{ArrayError, ArrayId};
use crate::error::{LeftOut, Rejected, Rejections};
use crate::format::Superblock;
use crate::members::{read_superblock, Member, MemberState};
use crate::options::EngineOptions;
use crate::recovery::Start;
use crate::{activity, intent, volume};
use std::sync::Arc;

/// A member found at open: its name, device and superblock.
type Found = (String, Arc<dyn Device>, Superblock);

/// Opens an array from its members, in any order; `None` is a member that
/// could not be found. The array is the one most of the devices belong
/// to; a device that is not one of its members (no superblock, another
/// array's, another geometry, too short) is left out and reported
/// ([`Array::rejected`]), counted with the missing. Opens degraded with up
/// to M unavailable, refuses more, and refuses two devices that claim the
/// same member.
pub fn open(devices: Vec<(String, Option<Arc<dyn Device>>)>) -> Result<Array, ArrayError> {
    open_with(devices, EngineOptions::default())
}

/// [`open`], run with `engine` options.
///
/// Opened again, everything done before serving, where opening found
/// that what it had left for later fails (the intent log's replay, or
/// the room it needed, brought in a map page that points into a
/// replayed slot where the replay wrote nothing, or a slot table page
/// that cannot be read): the replay is then mapped and every slot page
/// read before serving, and the checkpoint refused and every slot
/// scanned, as where eager replay finds it. (Only the stale map's case
/// has a test:
/// `map_pages::a_page_the_replay_finds_stale_while_opening_sends_it_to_the_scan`.)
/// (What the first try wrote is in stripes the second replays, and the
/// log keeps every block until its records are sealed and synced.)
pub fn open_with(devices: Vec<(String, Option<Arc<dyn Device>>)>, engine: EngineOptions) -> Result<Array, ArrayError> {
    match open_as(devices.clone(), engine.clone(), false) {
        Err(ArrayError::CheckpointUnreadable { .. }) => open_as(devices, engine, true),
        other => other,
    }
}

/// [`open_with`], once; `suspect`: as if the members' activity records
/// asked for everything before serving (`Start::Suspect`).
fn open_as(
    devices: Vec<(String, Option<Arc<dyn Device>>)>,
    engine: EngineOptions,
    suspect: bool,
) -> Result<Array, ArrayError> {
    let mut rejected: Vec<Rejected> = Vec::new();
    let mut found: Vec<Found> = Vec::new();
    let listed = devices.len();
    for (name, device) in devices {
        let Some(device) = device else { continue };
        match read_superblock(device.as_ref()) {
            Ok(sb) => found.push((name, device, sb)),
            Err(source) => {
                let words = ArrayError::NotAMember {
                    name: name.clone(),
                    source,
                }
                .to_string();
                rejected.push(Rejected {
                    name,
                    reason: LeftOut::NotAMember,
                    why: words,
                });
            }
        }
    }
    // Which array: the one most devices belong to, so that one foreign
    // device (however new its superblock) cannot pass for the array and
    // make the real members look foreign.
    let mut votes: Vec<([u8; 16], usize)> = Vec::new();
    for (_, _, sb) in &found {
        match votes.iter_mut().find(|(uuid, _)| *uuid == sb.array_uuid) {
            Some((_, count)) => *count += 1,
            None => votes.push((sb.array_uuid, 1)),
        }
    }
    votes.sort_by_key(|&(_, count)| std::cmp::Reverse(count));
    if let [(first, count), (second, tied), ..] = votes[..] {
        if count == tied {
            return Err(ArrayError::SplitMembers {
                first: ArrayId(first),
                second: ArrayId(second),
                count,
            });
        }
    }
    let newest = found
        .iter()
        .filter(|(_, _, sb)| votes.first().is_some_and(|(uuid, _)| sb.array_uuid == *uuid))
        .max_by_key(|(_, _, sb)| sb.generation)
        .map(|(_, _, sb)| sb.clone())
        .ok_or_else(|| ArrayError::NoMemberFound {
            listed,
            why: Rejections(rejected.clone()),
        })?;
    let geometry = &newest.geometry;
    let mut members: Vec<Option<Found>> = (0..geometry.members).map(|_| None).collect();
    for (name, device, sb) in found {
        let reason = if sb.array_uuid != newest.array_uuid {
            let words = ArrayError::ForeignMember {
                name: name.clone(),
                found: ArrayId(sb.array_uuid),
                expected: ArrayId(newest.array_uuid),
            }
            .to_string();
            let array = ArrayId(sb.array_uuid).to_string();
            Some((LeftOut::OtherArray { array }, words))
        } else if sb.geometry != *geometry {
            let words = ArrayError::WrongMember { name: name.clone() }.to_string();
            Some((LeftOut::OtherShape, words))
        } else if device.size() < geometry.member_bytes {
            let (bytes, needed) = (device.size(), geometry.member_bytes);
            let words =
                format!("{name} is {bytes} bytes, shorter than the array's members ({needed} bytes): truncated?");
            Some((LeftOut::TooShort { bytes, needed }, words))
        } else {
            None
        };
        if let Some((reason, words)) = reason {
            rejected.push(Rejected {
                name,
                reason,
                why: words,
            });
            continue;
        }
        let index = sb.member_index;
        if let Some((first, _, _)) = &members[index] {
            return Err(ArrayError::DuplicateMember {
                index,
                first: first.clone(),
                second: name,
            });
        }
        members[index] = Some((name, device, sb));
    }
    let members: Vec<Member> = members
        .into_iter()
        .enumerate()
        .map(|(index, slot)| match slot {
            Some((name, device, sb)) => Member {
                name,
                uuid: sb.member_uuid,
                // Recorded failed: taken out by hand (its own superblock
                // says so too), or gone and come back.
                state: match (newest.is_failed(index), sb.is_failed(index)) {
                    (false, _) => MemberState::Healthy,
                    (true, true) => MemberState::Failed,
                    (true, false) => MemberState::Stale,
                },
                device: Some(device),
            },
            None => Member {
                name: format!("member {index}"),
                uuid: [0; 16],
                device: None,
                state: if newest.is_failed(index) {
                    MemberState::Failed
                } else {
                    MemberState::Missing
                },
            },
        })
        .collect();
    let unavailable = members.iter().filter(|m| m.state != MemberState::Healthy).count();
    if unavailable > geometry.parity {
        return Err(ArrayError::TooManyUnavailable {
            unavailable,
            parity: geometry.parity,
            why: Rejections(rejected.clone()),
        });
    }
    let log_devices =
        intent::find_log_devices(&newest, &engine.log_devices, engine.discard_missing_log, &mut rejected)?;
    // Recorded failed once the array is up (a no-op for those already).
    let missing_logs: Vec<usize> = (0..log_devices.len())
        .filter(|&i| log_devices[i].device.is_none())
        .collect();
    if !engine.ignore_activity {
        let present: Vec<(String, Arc<dyn Device>)> = members
            .iter()
            .filter_map(|m| m.device.clone().map(|d| (m.name.clone(), d)))
            .collect();
        activity::check_idle(&present, newest.array_uuid, activity::ACTIVITY_WATCH)?;
    }
    // Read before the array writes its own records, which clear the mark.
    let readable: Vec<Arc<dyn Device>> = members
        .iter()
        .filter(|m| m.state == MemberState::Healthy)
        .filter_map(|m| m.device.clone())
        .collect();
    let start = match activity::clean_at(&readable, newest.array_uuid) {
        Some(sequence) => Start::Clean(sequence),
        None if suspect || activity::pages_suspect(&readable, newest.array_uuid) => Start::Suspect,
        None => Start::Unknown,
    };
    let newest = volume_table(newest, &members)?;
    let array = Array::assemble(newest, members, engine, rejected, log_devices, start)?;
    array.shared.stripes.members.record_missing()?;
    for index in missing_logs {
        array.shared.stripes.members.record_log_failed(index)?;
    }
    Ok(array)
}

/// The superblock with the volume table it names, read from the first
/// member that holds a copy with its CRC.
fn volume_table(mut superblock: Superblock, members: &[Member]) -> Result<Superblock, ArrayError> {
    if superblock.volume_table_crc == 0 {
        return Ok(superblock);
    }
    let table = members
        .iter()
        .filter(|m| m.state == MemberState::Healthy)
        .filter_map(|m| m.device.as_ref())
        .find_map(|d| volume::VolumeTable::read_from(d.as_ref(), &superblock.array_uuid, superblock.volume_table_crc))
        .ok_or(ArrayError::VolumeTableUnreadable {
            crc: superblock.volume_table_crc,
        })?;
    superblock.volume_table = Some(Arc::new(table));
    Ok(superblock)
}
