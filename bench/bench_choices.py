#!/usr/bin/env python3
"""bench_choices.py: what n > 1 saves. One request with n choices (one prefill and SnapKV
compression, the compressed cache copied per choice) against n separate concurrent requests
of the same prompt, on a running server; medians of --reps, one run.

  build/snapserve serve --port 8000 --max-model-len 4096 &
  python3 bench/bench_choices.py --url http://127.0.0.1:8000 --n 4 --entries 110
"""
import argparse
import concurrent.futures as cf
import json
import statistics
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--n", type=int, default=4, help="choices")
    ap.add_argument("--entries", type=int, default=110, help="prompt size (about 18 tokens each)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--budget", type=int, default=128, help="SnapKV budget")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()

    def post(body):
        req = urllib.request.Request(a.url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            return json.load(r)

    prompt = " ".join(f"Entry {i}: the harbour log notes wind, tide and the ships that passed."
                      for i in range(a.entries))
    base = {"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0.8, "ignore_eos": True,
            "kv_compression": {"policy": "snapkv", "budget": a.budget, "window": 16}}
    tokens = post({**base, "max_tokens": 1})["usage"]["prompt_tokens"]
    together, apart = [], []
    for rep in range(a.reps):
        t = time.time()
        j = post({**base, "n": a.n, "seed": rep})
        together.append(time.time() - t)
        assert len(j["choices"]) == a.n
        t = time.time()
        with cf.ThreadPoolExecutor(a.n) as ex:
            list(ex.map(lambda c: post({**base, "seed": rep + c}), range(a.n)))
        apart.append(time.time() - t)
    f, s = statistics.median(together), statistics.median(apart)
    print(f"prompt {tokens} tokens, {a.max_tokens} new tokens per choice, snapkv budget {a.budget}")
    print(f"one request with n={a.n}: median {f:.2f} s; {a.n} separate concurrent requests: "
          f"median {s:.2f} s; {s / f:.2f}x")


if __name__ == "__main__":
    main()
