//! The CRC-32s of the trackers' record formats, bit by bit (their files are a few
//! kilobytes): reflected, all ones in and out, and differing only in the polynomial.

/// zlib's CRC-32, which W&B's datastore uses.
pub const IEEE: u32 = 0xedb8_8320;
/// CRC-32C, which TFRecord (TensorBoard's event files) uses.
pub const CASTAGNOLI: u32 = 0x82f6_3b78;

/// The CRC-32 of `bytes` with the reflected `polynomial`.
pub fn crc32(polynomial: u32, bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ polynomial } else { crc >> 1 };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_crc_matches_its_check_values() {
        assert_eq!(crc32(IEEE, b"123456789"), 0xcbf4_3926);
        // The standard check value of CRC-32C, and RFC 3720's 32 bytes of zeros.
        assert_eq!(crc32(CASTAGNOLI, b"123456789"), 0xe306_9283);
        assert_eq!(crc32(CASTAGNOLI, &[0u8; 32]), 0x8a91_36aa);
    }
}
