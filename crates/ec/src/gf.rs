//! Arithmetic in GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11D).
//!
//! # Theory
//!
//! The field has 256 elements, the bytes. Addition is XOR. Multiplication is
//! polynomial multiplication modulo 0x11D, for which 2 (the polynomial `x`) is
//! a generator: every non-zero byte is `2^i` for exactly one `i` in 0..255.
//! With `exp[i] = 2^i` and `log[2^i] = i`, a product of non-zero bytes is
//! `exp[log a + log b]` and an inverse is `exp[255 - log a]`. This is the field
//! Intel ISA-L, Jerasure and most Reed-Solomon storage codes use, so parity
//! written by Tessera is byte-for-byte what ISA-L writes for the same matrix.
//!
//! Two derived forms feed the SIMD kernels:
//!
//! * nibble tables: for a constant `c`, `lo[i] = c * i` and `hi[i] = c * (i << 4)`
//!   for `i` in 0..16. Since multiplication distributes over XOR,
//!   `c * x = lo[x & 15] ^ hi[x >> 4]`; two 16-entry lookups are what
//!   `pshufb` does in one instruction per 16 bytes. The 32-byte layout
//!   `lo ++ hi` is the one ISA-L's `ec_init_tables` writes.
//! * affine matrices: multiplication by `c` is linear over GF(2), an 8x8 bit
//!   matrix whose column `j` is `c * 2^j`. GFNI's `gf2p8affineqb` applies such
//!   a matrix to every byte of a vector; it wants row `i` (the bits that feed
//!   output bit `i`) in byte `7 - i` of a 64-bit word.
//!
//! Worked example: `3 * 7`. `log 3 = 25`, `log 7 = 198`, `25 + 198 = 223`,
//! `exp[223] = 9`; by hand, `(x + 1)(x^2 + x + 1) = x^3 + 1 = 9`.

/// The reduction polynomial, with its x^8 term.
pub const POLY: u16 = 0x11D;

const fn build_tables() -> ([u8; 512], [u8; 256]) {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    // A doubled table lets `mul` skip the reduction modulo 255.
    while i < 512 {
        exp[i] = exp[i - 255];
        i += 1;
    }
    (exp, log)
}

const TABLES: ([u8; 512], [u8; 256]) = build_tables();
static EXP: [u8; 512] = TABLES.0;
static LOG: [u8; 256] = TABLES.1;

/// `a * b` in GF(2^8).
#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
}

/// The multiplicative inverse of a non-zero byte.
#[inline]
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "zero has no inverse in GF(2^8)");
    EXP[255 - LOG[a as usize] as usize]
}

/// `2^e`, with `e` taken modulo 255.
#[inline]
pub fn exp2(e: usize) -> u8 {
    EXP[e % 255]
}

/// The 32-byte nibble table of `c`: `c * i` then `c * (i << 4)` for i in 0..16.
pub fn nibble_table(c: u8) -> [u8; 32] {
    let mut table = [0u8; 32];
    for i in 0..16u8 {
        table[i as usize] = mul(c, i);
        table[16 + i as usize] = mul(c, i << 4);
    }
    table
}

/// The GFNI affine matrix of multiplication by `c` (see the module comment).
pub fn affine_matrix(c: u8) -> u64 {
    let mut matrix = 0u64;
    for row in 0..8 {
        let mut bits = 0u8;
        for column in 0..8 {
            if mul(c, 1 << column) & (1 << row) != 0 {
                bits |= 1 << column;
            }
        }
        matrix |= (bits as u64) << (8 * (7 - row));
    }
    matrix
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mul_slow(mut a: u8, mut b: u8) -> u8 {
        // Shift-and-add multiplication, reduced as it goes.
        let mut product = 0u8;
        while b != 0 {
            if b & 1 != 0 {
                product ^= a;
            }
            let carry = a & 0x80 != 0;
            a <<= 1;
            if carry {
                a ^= (POLY & 0xFF) as u8;
            }
            b >>= 1;
        }
        product
    }

    #[test]
    fn mul_matches_shift_and_add_for_every_pair() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul_slow(a, b), "{a} * {b}");
            }
        }
    }

    #[test]
    fn worked_example() {
        assert_eq!(mul(3, 7), 9);
    }

    #[test]
    fn inverse_of_every_nonzero_byte() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1);
        }
    }

    #[test]
    fn two_generates_the_field() {
        let mut seen = [false; 256];
        for e in 0..255 {
            let x = exp2(e);
            assert!(!seen[x as usize]);
            seen[x as usize] = true;
        }
        assert!(!seen[0]);
    }

    #[test]
    fn nibble_table_and_affine_matrix_multiply() {
        for c in 0..=255u8 {
            let table = nibble_table(c);
            let matrix = affine_matrix(c);
            for x in 0..=255u8 {
                let by_table = table[(x & 15) as usize] ^ table[16 + (x >> 4) as usize];
                assert_eq!(by_table, mul(c, x));
                // Apply the matrix as GFNI does: output bit i is the parity of
                // (byte 7-i of the matrix) AND x.
                let mut by_matrix = 0u8;
                for bit in 0..8 {
                    let row = (matrix >> (8 * (7 - bit))) as u8;
                    by_matrix |= (((row & x).count_ones() & 1) as u8) << bit;
                }
                assert_eq!(by_matrix, mul(c, x));
            }
        }
    }
}
