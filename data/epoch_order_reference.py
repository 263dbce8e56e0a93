#!/usr/bin/env python3
"""Reference for EpochPermutation (epoch_order.cc), written from the C++ standard's definitions.

std::seed_seq::generate ([rand.util.seedseq]) and std::mt19937_64 ([rand.eng.mers]) are specified
bit for bit; the bounded mapping is Lemire's multiply-and-reject. Use this to reproduce a job's
data order outside C++ (e.g. for a PyTorch peer) or to check the golden values in
epoch_order_test.cc:  python3 epoch_order_reference.py COUNT SEED EPOCH [HOW_MANY]
"""
import sys

M32 = 0xFFFFFFFF
M64 = (1 << 64) - 1


def seed_seq_generate(values, n):
    out = [0x8B8B8B8B] * n
    s = len(values)
    t = 11 if n >= 623 else 7 if n >= 68 else 5 if n >= 39 else 3 if n >= 7 else (n - 1) // 2
    p = (n - t) // 2
    q = p + t
    m = max(s + 1, n)

    def mix(x):
        return x ^ (x >> 27)

    for k in range(m):
        r1 = (1664525 * mix(out[k % n] ^ out[(k + p) % n] ^ out[(k - 1) % n])) & M32
        r2 = (r1 + (s if k == 0 else (k % n + values[k - 1]) if k <= s else k % n)) & M32
        out[(k + p) % n] = (out[(k + p) % n] + r1) & M32
        out[(k + q) % n] = (out[(k + q) % n] + r2) & M32
        out[k % n] = r2
    for k in range(m, m + n):
        r3 = (1566083941 * mix((out[k % n] + out[(k + p) % n] + out[(k - 1) % n]) & M32)) & M32
        r4 = (r3 - k % n) & M32
        out[(k + p) % n] ^= r3
        out[(k + q) % n] ^= r4
        out[k % n] = r4
    return out


class MT19937_64:
    N, M = 312, 156

    def __init__(self, seed_values):
        words = seed_seq_generate(seed_values, 2 * self.N)
        self.state = [words[2 * i] | (words[2 * i + 1] << 32) for i in range(self.N)]
        self.index = self.N

    def __call__(self):
        if self.index >= self.N:
            x = self.state
            for i in range(self.N):
                y = (x[i] & ~((1 << 31) - 1) & M64) | (x[(i + 1) % self.N] & ((1 << 31) - 1))
                x[i] = x[(i + self.M) % self.N] ^ (y >> 1) ^ (0xB5026F5AA96619E9 if y & 1 else 0)
            self.index = 0
        z = self.state[self.index]
        self.index += 1
        z ^= (z >> 29) & 0x5555555555555555
        z ^= (z << 17) & 0x71D67FFFEDA60000
        z ^= (z << 37) & 0xFFF7EEE000000000
        z ^= z >> 43
        return z & M64


def uniform_below(rng, bound):
    product = rng() * bound
    if (product & M64) < bound:
        threshold = ((1 << 64) - bound) % bound
        while (product & M64) < threshold:
            product = rng() * bound
    return product >> 64


def epoch_permutation(count, seed, epoch):
    order = list(range(count))
    rng = MT19937_64([seed & M32, (seed >> 32) & M32, epoch & M32, (epoch >> 32) & M32])
    for i in range(count - 1, 0, -1):
        j = uniform_below(rng, i + 1)
        order[i], order[j] = order[j], order[i]
    return order


if __name__ == "__main__":
    count, seed, epoch = (int(a) for a in sys.argv[1:4])
    how_many = int(sys.argv[4]) if len(sys.argv) > 4 else count
    print(epoch_permutation(count, seed, epoch)[:how_many])
