#!/usr/bin/env bash
# run_fuzz.sh [--runs N | --seconds S] [--corpus DIR] [--fresh] [TARGET...]: builds the libFuzzer
# targets of fuzz/ (clang, every library instrumented, ASan + UBSan; build dir $SNAP_FUZZ_BUILD,
# default build-fuzz), runs each (default: all) from its corpus, and prints one line per target:
# executions, exec/s, edges covered, features, corpus size, crashes. A crash's input is copied to
# tests/fixtures/fuzz/TARGET/ so that `ctest -L fuzz` replays it from then on (fix the parser,
# keep the input).
# The corpus persists between runs (--corpus, default $SNAP_FUZZ_CORPUS or
# ~/.cache/snapserve/fuzz-corpus; the seeds of tests/fixtures/fuzz are added each time), so a
# long campaign can run in pieces: every run appends a row (UTC time, commit, target, executions,
# seconds, exec/s, edges, crashes) to docs/fuzz_ledger.tsv, and --totals sums the ledger per
# target. --fresh starts from the seeds alone in a scratch corpus (nothing carried over).
# Not a test: it runs as long as asked.
#   bench/run_fuzz.sh --runs 10000000            # the goal: 0 crashes in 10M runs per target
#   bench/run_fuzz.sh --seconds 60 api_request step_plan
#   bench/run_fuzz.sh --totals                   # executions and crashes so far, per target
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${SNAP_FUZZ_BUILD:-$root/build-fuzz}
ledger=$root/docs/fuzz_ledger.tsv
corpus_root=${SNAP_FUZZ_CORPUS:-$HOME/.cache/snapserve/fuzz-corpus}
runs=-1 seconds=0 fresh=0
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --corpus) corpus_root=$2; shift 2 ;;
    --fresh) fresh=1; shift ;;
    --totals)
      [ -f "$ledger" ] || { echo "run_fuzz: no ledger at $ledger yet" >&2; exit 1; }
      awk -F'\t' 'NR > 1 { n[$3] += $4; c[$3] += $8; r[$3]++; s[$3] += $5; if (!($3 in f)) f[$3] = $2; l[$3] = $2 }
        END { printf "%-18s %12s %6s %9s %7s  %s\n", "target", "executions", "runs", "seconds", "crashes", "commits (first..last)"
              for (t in n) printf "%-18s %12d %6d %9d %7d  %s..%s\n", t, n[t], r[t], s[t], c[t], f[t], l[t] }' "$ledger" | { read -r header; echo "$header"; sort; }
      exit 0 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "run_fuzz: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
case $runs in -1|[0-9]*) ;; *) echo "run_fuzz: --runs needs a number, got '$runs'" >&2; exit 2 ;; esac
case $seconds in [0-9]*) ;; *) echo "run_fuzz: --seconds needs a number, got '$seconds'" >&2; exit 2 ;; esac
[ "$runs" = -1 ] && [ "$seconds" = 0 ] && runs=1000000
if [ ${#targets[@]} -eq 0 ]; then
  read -ra targets < <(sed -n 's/^set(snap_fuzz_names \(.*\))$/\1/p' "$root/fuzz/CMakeLists.txt")
fi
command -v clang++ >/dev/null || { echo "run_fuzz: clang++ is needed (apt-get install clang)" >&2; exit 1; }

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSNAP_FUZZ=ON \
  -DSNAP_ENABLE_CUDA=OFF -DSNAP_BUILD_BENCH=OFF >/dev/null || exit 1
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null || {
  echo "run_fuzz: build failed (run: cmake --build $build --target fuzz_...)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/snap_fuzz.XXXXXX")
commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD -- fuzz comm common coordinator worker 2>/dev/null || commit="$commit+dirty"
[ -f "$ledger" ] || printf 'utc\tcommit\ttarget\texecutions\tseconds\texec_per_s\tedges\tcrashes\n' >"$ledger"
printf '%-18s %12s %9s %7s %7s %7s %8s %s\n' target executions exec/s edges features corpus seconds crashes
status=0
for t in "${targets[@]}"; do
  corpus=$corpus_root/$t artifacts=$work/$t/artifacts/
  [ $fresh = 1 ] && corpus=$work/$t/corpus
  mkdir -p "$corpus" "$artifacts"
  cp -rn "$root/tests/fixtures/fuzz/$t/." "$corpus/" 2>/dev/null
  # tokenizer_json's seeds are the tokenizer fixtures shrunk to a few KB (tools/gen_fuzz_seeds.py)
  # and its inputs stay under 8 KiB: on the 55 KB fixtures themselves it ran 140-250 exec/s
  # and covered fewer edges in 20 minutes (3,772) than the small seeds do in one (3,921).
  max_len=262144
  case $t in
    gguf) cp -n "$root"/tests/fixtures/gguf/tiny.gguf "$root"/tests/fixtures/tokenizer/spm.gguf "$corpus/" ;;
    tokenizer_json) max_len=8192 ;;
    # batch_line rewrites and rescans its output file for every input: with inputs up to 256 KiB
    # an evolved corpus ran 241 exec/s (290,139 runs in 20 min at load 8-14); a JSONL line longer
    # than 16 KiB is the same structure with a longer string.
    batch_line) max_len=16384 ;;
  esac
  limit=(-runs="$runs")
  [ "$seconds" != 0 ] && limit=(-max_total_time="$seconds")
  start=$SECONDS
  "$build/fuzz/fuzz_$t" "$corpus" "${limit[@]}" -max_len=$max_len -timeout=10 -rss_limit_mb=4096 \
    -artifact_prefix="$artifacts" -print_final_stats=1 >"$work/$t.log" 2>&1
  rc=$?
  secs=$((SECONDS - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/$t.log" | tail -1)
  stats=$(grep -E '^#[0-9]+' "$work/$t.log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$stats")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$stats")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$stats")
  crashes=$(find "$artifacts" -type f | wc -l)
  # 72 is libFuzzer's exit code for an interrupt (SIGINT ends a long run early; its row counts).
  if [ "$crashes" = 0 ] && [ $rc = 72 ]; then
    echo "run_fuzz: $t interrupted after ${execs:-?} executions, no crash" >&2
  elif [ "$crashes" -gt 0 ] || [ $rc -ne 0 ]; then
    status=1
    mkdir -p "$root/tests/fixtures/fuzz/$t"
    for f in "$artifacts"*; do [ -f "$f" ] && cp "$f" "$root/tests/fixtures/fuzz/$t/"; done
    echo "run_fuzz: $t failed (rc $rc); log: $work/$t.log; inputs copied to tests/fixtures/fuzz/$t/" >&2
    grep -m3 -E "ERROR|SUMMARY" "$work/$t.log" >&2
  fi
  [ -n "$execs" ] && printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$commit" "$t" \
    "$execs" "$secs" "${rate:-0}" "${cov:-0}" "$crashes" >>"$ledger"
  printf '%-18s %12s %9s %7s %7s %7s %8s %s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$secs" "$crashes"
done
echo "logs: $work; corpora: $([ $fresh = 1 ] && echo "$work" || echo "$corpus_root"); ledger: $ledger"
exit $status
