#!/usr/bin/env python3
"""Reference for eval/longctx/haystack.cpp's EvalRng (splitmix64), below() (rejection, no
modulo bias) and mix_seed (FNV-1a with a terminator byte): writes the golden values that
tests/eval_longctx/test_eval_tasks.cpp checks, so a change to the task RNG is caught.
    python3 tools/eval_rng_reference.py > tests/fixtures/eval_longctx/rng.json
"""
import json

M = (1 << 64) - 1


class Rng:
    def __init__(self, seed):
        self.state = seed & M

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & M
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        return z ^ (z >> 31)

    def below(self, n):
        if n <= 1:
            return 0
        limit = M - M % n
        while True:
            x = self.next_u64()
            if x < limit:
                return x % n


def mix_seed(h, s):
    for c in s.encode():
        h = ((h ^ c) * 1099511628211) & M
    return ((h ^ 0xFF) * 1099511628211) & M


def main():
    r = Rng(42)
    u64 = [str(r.next_u64()) for _ in range(5)]
    r = Rng(7)
    below = [r.below(n) for n in (1, 2, 3, 10, 1000, 7777777, 2**63 + 5)]
    mix = str(mix_seed(mix_seed(1469598103934665603, "snapserve-eval-v1"), "niah_single"))
    print(json.dumps({"seed42_u64": u64, "seed7_below": [str(b) for b in below],
                      "below_n": ["1", "2", "3", "10", "1000", "7777777", str(2**63 + 5)],
                      "mix_v1_niah_single": mix}, indent=1))


if __name__ == "__main__":
    main()
