// Runs the kernels' hash functions on the host (kernels.cu built as C++
// with TESSERA_HOST_TEST), for `host_hashes_equal_the_reference` in
// tests.rs. Reads records from stdin: algorithm (u32: 0 SHA-256,
// 1 SHA3-512, 2 SHA3-512 a warp a message), prefix length (u32), prefix (u64), body length (u64), body;
// prints each digest's 64 output bytes in hex, one line a record.
#include "kernels.cu"
#include <cstdio>
#include <vector>

static bool read_all(void* to, size_t n) { return fread(to, 1, n, stdin) == n; }

int main() {
    for (;;) {
        u32 algorithm, plen;
        u64 prefix, n;
        if (!read_all(&algorithm, 4)) return 0;
        if (!read_all(&plen, 4) || !read_all(&prefix, 8) || !read_all(&n, 8)) return 2;
        // An 8-byte aligned body with slack after it, as the kernels expect.
        std::vector<u64> body(n / 8 + 4, 0);
        if (!read_all(body.data(), n)) return 2;
        Message m = {(const u8*)body.data(), n, prefix, plen};
        u64 out[8];
        if (algorithm == 2) {
            sha3_512_warp(m, out);
        } else {
            digest((int)algorithm, m, out);
        }
        for (int w = 0; w < 8; w++) {
            for (int b = 0; b < 8; b++) printf("%02x", (unsigned)((out[w] >> (8 * b)) & 0xff));
        }
        printf("\n");
    }
}
