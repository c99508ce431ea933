//! The few protocol-buffer encodings the trackers' files need, written by hand: each
//! message is a handful of fields, not worth a code generator or a runtime library.

/// Wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LENGTH_DELIMITED: u8 = 2;
const FIXED32: u8 = 5;

pub fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn tag(field: u32, wire: u8, out: &mut Vec<u8>) {
    varint(u64::from(field) << 3 | u64::from(wire), out);
}

/// A string, bytes or an embedded message.
pub fn bytes(field: u32, value: &[u8], out: &mut Vec<u8>) {
    tag(field, LENGTH_DELIMITED, out);
    varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

pub fn int64(field: u32, value: i64, out: &mut Vec<u8>) {
    tag(field, VARINT, out);
    varint(value as u64, out);
}

pub fn double(field: u32, value: f64, out: &mut Vec<u8>) {
    tag(field, FIXED64, out);
    out.extend_from_slice(&value.to_le_bytes());
}

pub fn float(field: u32, value: f32, out: &mut Vec<u8>) {
    tag(field, FIXED32, out);
    out.extend_from_slice(&value.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_encode_as_the_protobuf_encoding_guide_shows() {
        // The guide's examples: field 1 = 150 is 08 96 01; field 2 = "testing" is 12 07 74…
        let mut out = Vec::new();
        int64(1, 150, &mut out);
        bytes(2, b"testing", &mut out);
        assert_eq!(out, [0x08, 0x96, 0x01, 0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g']);
        // A field past 15 takes a two-byte tag: 17 << 3 | 2 = 138.
        let mut out = Vec::new();
        bytes(17, b"", &mut out);
        assert_eq!(out, [0x8a, 0x01, 0x00]);
    }
}
