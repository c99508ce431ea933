//! TensorBoard's event files, written by hand: a file is a sequence of TFRecord records
//! (length, its masked CRC-32C, the bytes, their masked CRC-32C), each an `Event`
//! protocol buffer with a wall time, a step and scalar summary values. The first event
//! names the file version, as TensorFlow's own writer does. `tensorboard --logdir` reads
//! the file as it grows; no TensorFlow or protobuf library is needed to write it.

use super::crc::{CASTAGNOLI, crc32};
use super::protobuf;

/// The file's version event, which readers expect first.
const FILE_VERSION: &str = "brain.Event:2";

/// One event file: its bytes so far (it is rewritten whole, so that an object store,
/// which cannot append, holds it as well as a local folder).
#[derive(Debug, Clone)]
pub struct EventFile {
    bytes: Vec<u8>,
}

impl EventFile {
    pub fn new(wall_time: f64) -> EventFile {
        let mut file = EventFile { bytes: Vec::new() };
        file.record(&event(wall_time, 0, Payload::FileVersion(FILE_VERSION)));
        file
    }

    /// Appends one event with these scalars at `step`.
    pub fn scalars(&mut self, wall_time: f64, step: i64, values: &[(String, f64)]) {
        self.record(&event(wall_time, step, Payload::Scalars(values)));
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn record(&mut self, data: &[u8]) {
        let length = (data.len() as u64).to_le_bytes();
        self.bytes.extend_from_slice(&length);
        self.bytes.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
        self.bytes.extend_from_slice(data);
        self.bytes.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    }
}

enum Payload<'a> {
    FileVersion(&'a str),
    Scalars(&'a [(String, f64)]),
}

/// `Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }`
/// with `Summary { repeated Value value = 1; }` and `Value { string tag = 1; float simple_value = 2; }`.
fn event(wall_time: f64, step: i64, payload: Payload) -> Vec<u8> {
    let mut out = Vec::new();
    protobuf::double(1, wall_time, &mut out);
    protobuf::int64(2, step, &mut out);
    match payload {
        Payload::FileVersion(version) => protobuf::bytes(3, version.as_bytes(), &mut out),
        Payload::Scalars(values) => {
            let mut summary = Vec::new();
            for (tag, value) in values {
                let mut entry = Vec::new();
                protobuf::bytes(1, tag.as_bytes(), &mut entry);
                protobuf::float(2, *value as f32, &mut entry);
                protobuf::bytes(1, &entry, &mut summary);
            }
            protobuf::bytes(5, &summary, &mut out);
        }
    }
    out
}

/// TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant, so that a CRC
/// of data holding CRCs is not degenerate.
fn masked_crc32c(bytes: &[u8]) -> u32 {
    crc32(CASTAGNOLI, bytes).rotate_right(15).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_encodes_as_its_protocol_buffer() {
        let encoded = event(1.5, 300, Payload::Scalars(&[("a".into(), 0.5)]));
        let mut expected = vec![0x09];
        expected.extend_from_slice(&1.5f64.to_le_bytes());
        expected.extend_from_slice(&[0x10, 0xac, 0x02]); // 300 as a varint
        // summary (field 5) { value (field 1) { tag "a", simple_value 0.5 } }
        expected.extend_from_slice(&[0x2a, 10, 0x0a, 8, 0x0a, 1, b'a', 0x15]);
        expected.extend_from_slice(&0.5f32.to_le_bytes());
        assert_eq!(encoded, expected);
    }

    #[test]
    fn records_frame_each_event_with_its_length_and_checksums() {
        let file = EventFile::new(2.0);
        let bytes = file.bytes();
        let length = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(bytes.len(), 8 + 4 + length + 4);
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), masked_crc32c(&bytes[..8]));
        let data = &bytes[12..12 + length];
        assert!(data.ends_with(FILE_VERSION.as_bytes()));
        assert_eq!(u32::from_le_bytes(bytes[12 + length..].try_into().unwrap()), masked_crc32c(data));
    }
}
