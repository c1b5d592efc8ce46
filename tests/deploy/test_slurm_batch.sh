#!/usr/bin/env bash
# test_slurm_batch.sh SNAPSERVE [MODEL]: deploy/slurm/ on a real (private, one-node) Slurm.
#
# 1. A 24-line OpenAI Batch corpus (chat and completion lines, temperature 0, ignore_eos,
#    16-24 tokens, two with kv_compression, line 7 malformed) is run once by a plain
#    `snapserve batch` outside Slurm: the reference.
# 2. deploy/slurm/submit_batch.sh -n 3 submits batch_array.sbatch (3 tasks) and
#    batch_merge.sbatch (afterok on the array) to a private slurmctld+slurmd
#    (tests/deploy/slurm_cluster.sh).
# 3. While the tasks run, once a shard file has at least one line but not all: task 1's step
#    gets a real SIGKILL (`scancel --signal=KILL ARRAY_1.0`: the task ends FAILED, exit 137),
#    task 2 gets `scancel --signal=KILL ARRAY_2` (a job-level cancel: Slurm sends SIGTERM,
#    then SIGKILL after KillWait; the task ends CANCELLED). Either poisons the merge's
#    afterok (DependencyNeverSatisfied); deploy/slurm/requeue_batch.sh requeues both tasks
#    and repoints the merge.
# 5. batch_tp.sbatch runs the corpus again as one job of 3 MPI ranks (srun --mpi=pmix,
#    snapserve batch --tp 3): its records equal the reference's.
# 6. (CUDA builds) batch_tp.sbatch with BATCH_DEVICE=cuda on the host twin's snapserve, over
#    the corpus with top-2 logprobs: equal to one twin process up to greedy near-ties (below).
# 4. Checks: the merge job completes; the merged file has one record per input line, in order,
#    custom_ids matching; line 7 has an error record naming line 7; every shard file has each
#    of its lines exactly once, whole, and the killed shards kept what they had written
#    before the kill (the rerun resumed); every record's choices equal the reference's;
#    jobcomp shows FAILED/CANCELLED then COMPLETED for the killed tasks; the appended logs
#    show two runs of each.
# Exits 77 without Slurm or munge, when not root, or without the model.
#   SLURM_BATCH_TEST_KEEP=1  keep the work dir and the cluster's dir (printed)
set -uo pipefail

bin=$(realpath "${1:?usage: $0 SNAPSERVE [MODEL]}")
model=${2:-${SNAP_MODEL:-$HOME/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf}}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
deploy=$root/deploy/slurm

if [ ! -s "$model" ]; then
  echo "test_slurm_batch: model $model not found; skipping"
  exit 77
fi
model=$(realpath "$model")
# A run of ctest inside a Slurm job must not hand its SLURM_* variables to the tools or the
# reference run (they would pick a shard from them).
while read -r v; do unset "$v"; done < <(compgen -e | grep '^SLURM_')

work=$(mktemp -d "${TMPDIR:-/tmp}/test_slurm_batch.XXXXXX")
export SLURM_CLUSTER_NO_TRAP=1
# shellcheck source=tests/deploy/slurm_cluster.sh
source "$here/slurm_cluster.sh"
cleanup() {
  if [ "${SLURM_BATCH_TEST_KEEP:-0}" = 1 ]; then
    SLURM_CLUSTER_KEEP=1 slurm_cluster_stop
    echo "test_slurm_batch: kept $work" >&2
  else
    slurm_cluster_stop
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

fail() {
  echo "test_slurm_batch: FAIL: $*" >&2
  for f in "$work"/logs/*.out; do
    [ -e "$f" ] || continue
    echo "--- $f" >&2
    tail -n 25 "$f" >&2
  done
  if [ -n "${SLURM_CLUSTER_DIR:-}" ]; then
    echo "--- squeue" >&2
    squeue -o "%i %T %r %E" >&2 2>/dev/null
    echo "--- jobcomp" >&2
    slurm_cluster_jobcomp >&2
    slurm_cluster_logs 15
  fi
  exit 1
}

# --- the corpus: 24 lines, shard I of 3 gets lines I+1, I+4, ... ---------------------------
python3 - "$work/corpus.jsonl" <<'EOF' || fail "could not write the corpus"
import json, sys
topics = ["the tide", "a lighthouse", "winter bread", "the old map", "river stones",
          "a paper kite", "the night train", "mountain weather", "a quiet library",
          "the harbor market", "an orchard", "a violin"]
context = ("The keeper wrote in her log every evening: the wind had turned west, two ships had "
           "passed before noon, the lamp needed new oil, and the gulls had gathered on the rocks "
           "below the tower as they always did before a storm. ") * 2
lines = []
for k in range(1, 25):
    cid = f"req-{k:02d}"
    tokens = 16 + (k % 3) * 4                                 # 16, 20 or 24
    if k == 7:                                                # malformed: not JSON
        lines.append('{"custom_id": "req-07", "method": "POST", "url": "/v1/completions", '
                     '"body": {"prompt": "unterminated')
        continue
    common = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    if k in (5, 14):                                          # SnapKV on a longer prompt
        common["kv_compression"] = {"policy": "snapkv", "budget": 32, "window": 8}
    topic = topics[k % len(topics)]
    if k % 2:
        body = {"messages": [{"role": "user", "content":
                (context if "kv_compression" in common else "") +
                f"Write one sentence about {topic}."}], **common}
        url = "/v1/chat/completions"
    else:
        body = {"prompt": (context if "kv_compression" in common else "") +
                f"Here is a short story about {topic}. Once upon a time", **common}
        url = "/v1/completions"
    lines.append(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}))
with open(sys.argv[1], "w") as f:
    f.write("\n".join(lines) + "\n")
EOF
nlines=24
shards=3
per_shard=$((nlines / shards))

# --- 1. the reference, outside Slurm -------------------------------------------------------
batch_args="--max-num-seqs 1"
# shellcheck disable=SC2086
if ! "$bin" batch --input "$work/corpus.jsonl" --output "$work/reference.jsonl" --model "$model" \
     --threads 1 $batch_args 2>"$work/reference.err"; then
  cat "$work/reference.err" >&2
  fail "the reference run (snapserve batch outside Slurm) failed"
fi
[ "$(wc -l <"$work/reference.jsonl")" -eq "$nlines" ] ||
  fail "the reference has $(wc -l <"$work/reference.jsonl") lines, not $nlines"

# --- 2. the cluster and the submission ------------------------------------------------------
slurm_cluster_start
rc=$?
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || fail "the private Slurm did not start"
echo "test_slurm_batch: private Slurm in $SLURM_CLUSTER_DIR" >&2

out=$work/results.jsonl
ids=$(cd "$work" && SNAPSERVE_BIN=$bin SNAP_MODEL=$model BATCH_INPUT=corpus.jsonl \
      BATCH_OUTPUT=results.jsonl BATCH_LOG_DIR=logs BATCH_THREADS=1 BATCH_ARGS=$batch_args \
      bash "$deploy/submit_batch.sh" -n "$shards") || fail "submit_batch.sh failed"
array_job=$(sed -n 's/^array_job=\([0-9]*\)$/\1/p' <<<"$ids")
merge_job=$(sed -n 's/^merge_job=\([0-9]*\)$/\1/p' <<<"$ids")
{ [ -n "$array_job" ] && [ -n "$merge_job" ]; } || fail "submit_batch.sh printed no job ids: $ids"
echo "test_slurm_batch: array job $array_job, merge job $merge_job" >&2

# --- 3. kill tasks 1 and 2 mid-shard ------------------------------------------------------------
count() { if [ -e "$1" ]; then wc -l <"$1"; else echo 0; fi; }
shard_file() { echo "$out.$1-of-$shards"; }
killed1="" killed2=""
deadline=$((SECONDS + 180))
while [ -z "$killed1" ] || [ -z "$killed2" ]; do
  [ $SECONDS -lt $deadline ] || fail "no shard file of tasks 1/2 reached 1..$((per_shard - 1)) lines in 180 s"
  n1=$(count "$(shard_file 1)")
  if [ -z "$killed1" ] && [ "$n1" -ge 1 ]; then
    [ "$n1" -lt "$per_shard" ] || fail "task 1 finished its shard before it could be killed"
    scancel --signal=KILL "${array_job}_1.0" || fail "scancel --signal=KILL ${array_job}_1.0 failed"
    killed1=$n1
    echo "test_slurm_batch: SIGKILLed task 1's step with $n1 of $per_shard lines written" >&2
  fi
  n2=$(count "$(shard_file 2)")
  if [ -z "$killed2" ] && [ "$n2" -ge 1 ]; then
    [ "$n2" -lt "$per_shard" ] || fail "task 2 finished its shard before it could be killed"
    scancel --signal=KILL "${array_job}_2" || fail "scancel --signal=KILL ${array_job}_2 failed"
    killed2=$n2
    echo "test_slurm_batch: scancel --signal=KILL task 2 with $n2 of $per_shard lines written" >&2
  fi
  sleep 0.05
done

# Wait for both to end, then keep what their shard files hold: the rerun must keep it.
wait_state() {  # wait_state <job> <seconds> <states...>: echo the state reached
  local job=$1 limit=$2 s
  shift 2
  local end=$((SECONDS + limit))
  while [ $SECONDS -lt $end ]; do
    s=$(slurm_cluster_state "$job")
    for want in "$@"; do [ "$s" = "$want" ] && { echo "$s"; return 0; }; done
    sleep 0.2
  done
  echo "${s:-unknown}"
  return 1
}
s1=$(wait_state "${array_job}_1" 60 FAILED) || fail "task 1 is $s1 after its SIGKILL, not FAILED"
s2=$(wait_state "${array_job}_2" 60 CANCELLED) || fail "task 2 is $s2 after scancel, not CANCELLED"
cp "$(shard_file 1)" "$work/shard1.at_kill"
cp "$(shard_file 2)" "$work/shard2.at_kill"

# The merge's afterok can no longer be satisfied (checked on Slurm 22.05); say so if it changes.
dep=$(squeue -h -j "$merge_job" -o "%r %E" 2>/dev/null)
echo "test_slurm_batch: merge job after the kills: $dep" >&2

# --- requeue, as deploy/slurm/README.md says ----------------------------------------------------
bash "$deploy/requeue_batch.sh" "${array_job}_1" "${array_job}_2" ||
  fail "requeue_batch.sh ${array_job}_1 ${array_job}_2 failed"
ms=$(wait_state "$merge_job" 300 COMPLETED FAILED CANCELLED)
[ "$ms" = COMPLETED ] || fail "the merge job ended $ms (or did not end in 300 s)"
for t in 0 1 2; do
  st=$(slurm_cluster_state "${array_job}_$t")
  [ "$st" = COMPLETED ] || fail "task $t is $st, not COMPLETED"
done

# --- 4. checks ----------------------------------------------------------------------------------
# jobcomp: the killed tasks ended FAILED / CANCELLED, then COMPLETED after the requeue.
comp=$(slurm_cluster_jobcomp)
for t in 1 2; do
  states=$(grep "ArrayJobId=$array_job ArrayTaskId=$t " <<<"$comp" |
           sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p' | grep -v PENDING | paste -sd, -)
  want=$([ $t = 1 ] && echo FAILED,COMPLETED || echo CANCELLED,COMPLETED)
  [ "$states" = "$want" ] || fail "jobcomp records task $t as '$states', not $want"
done
# --open-mode=append: one log per task, two runs in the killed tasks' logs.
for t in 1 2; do
  log=$work/logs/snap-batch-${array_job}_$t.out
  [ -s "$log" ] || fail "no log $log"
  runs=$(grep -c "^snap-batch: .* task $t (min 0, 3 tasks), run [0-9]" "$log")
  [ "$runs" -eq 2 ] || fail "$log shows $runs runs, not 2"
done

python3 - "$work" "$nlines" "$shards" "$killed1" "$killed2" <<'EOF' || fail "output checks failed"
import json, re, sys
work, nlines, shards = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
errors = []

def records(path):
    data = open(path, "rb").read()
    if data and not data.endswith(b"\n"):
        errors.append(f"{path}: ends in a partial line")
    out = []
    for i, raw in enumerate(data.split(b"\n")[:-1], 1):
        try:
            out.append(json.loads(raw))
        except ValueError as e:
            errors.append(f"{path}:{i}: not JSON ({e}): {raw[:80]!r}")
    return out

corpus = open(f"{work}/corpus.jsonl").read().split("\n")[:-1]
def custom_id(k):
    try:
        return json.loads(corpus[k - 1])["custom_id"]
    except ValueError:
        return None

def choices(rec):
    body = (rec.get("response") or {}).get("body")
    if isinstance(body, str):
        body = json.loads(body)
    return None if body is None else (body.get("choices"), body.get("usage"))

# Shards: each owned line exactly once; killed shards kept their lines from before the kill.
for i in range(shards):
    path = f"{work}/results.jsonl.{i}-of-{shards}"
    recs = records(path)
    lines = [r.get("line") for r in recs]
    want = [k for k in range(1, nlines + 1) if (k - 1) % shards == i]
    if sorted(lines) != want:
        errors.append(f"shard {i}: lines {lines}, want each of {want} once")
    if i in (1, 2):
        before = open(f"{work}/shard{i}.at_kill", "rb").read()
        whole = before[: before.rfind(b"\n") + 1]
        kept = whole.count(b"\n")
        if not open(path, "rb").read().startswith(whole):
            errors.append(f"shard {i}: the rerun did not keep the {kept} lines written before the kill")
        print(f"shard {i}: {kept} lines before the kill (seen {sys.argv[3 + i]} when killed), "
              f"{len(recs)} after the rerun")

# Merged: one record per input line, in order, custom_ids matching, same text as the reference.
merged = records(f"{work}/results.jsonl")
reference = {r.get("line"): r for r in records(f"{work}/reference.jsonl")}
if [r.get("line") for r in merged] != list(range(1, nlines + 1)):
    errors.append(f"merged lines {[r.get('line') for r in merged]}, want 1..{nlines} in order")
for r in merged:
    k = r.get("line")
    if k == 7:
        err = r.get("error")
        msg = json.dumps(err)
        if not err or not re.search(r"\bline 7\b", msg):
            errors.append(f"line 7 (malformed): error {msg} does not name line 7")
        continue
    if r.get("custom_id") != custom_id(k):
        errors.append(f"line {k}: custom_id {r.get('custom_id')!r}, want {custom_id(k)!r}")
    if r.get("error") is not None or (r.get("response") or {}).get("status_code") != 200:
        errors.append(f"line {k}: not a success: {json.dumps(r)[:200]}")
        continue
    ref = reference.get(k)
    if ref is None or choices(r) != choices(ref):
        errors.append(f"line {k}: differs from the run outside Slurm:\n  slurm {choices(r)}\n"
                      f"  alone {None if ref is None else choices(ref)}")
for e in errors:
    print("  " + e)
print(f"merged: {len(merged)} records checked against the reference, {len(errors)} problems")
sys.exit(1 if errors else 0)
EOF

# --- 5. batch_tp.sbatch: the same corpus tensor-parallel, srun --mpi=pmix -n 3 --tp 3 ----------
# (3 ranks on the node's 2 CPUs: --overcommit, under which batch_tp.sbatch makes Open MPI yield;
# SmolLM2's 9 heads split 3 ways.)
tp_rc=0
(cd "$work" && SNAPSERVE_BIN=$bin SNAP_MODEL=$model BATCH_INPUT=corpus.jsonl BATCH_OUTPUT=tp.jsonl \
   BATCH_THREADS=1 BATCH_ARGS=$batch_args \
   timeout 300 sbatch --wait --parsable --ntasks=3 --overcommit --output="$work/logs/tp-%j.out" \
   "$deploy/batch_tp.sbatch" >"$work/tp.jobid") || tp_rc=$?
[ "$tp_rc" -eq 0 ] || fail "batch_tp.sbatch ended with $tp_rc ($(cat "$work/tp.jobid" 2>/dev/null))"
grep -q "ranks" "$work"/logs/tp-*.out || fail "batch_tp.sbatch's log does not name its ranks"
python3 - "$work" <<'EOF2' || fail "the tensor-parallel records differ from the reference"
import json, sys
work = sys.argv[1]
def load(p):
    out = {}
    for raw in open(p):
        r = json.loads(raw)
        if r["line"] in out:
            sys.exit(f"{p}: line {r['line']} twice")
        out[r["line"]] = (r["custom_id"], r["error"] is None,
                          (r["response"]["body"] or {}).get("choices"))
    return out
tp, ref = load(f"{work}/tp.jsonl"), load(f"{work}/reference.jsonl")
bad = [k for k in ref if tp.get(k) != ref[k]]
print(f"batch_tp: {len(tp)} records, {len(bad)} differ from one process {bad[:5]}")
sys.exit(1 if bad or len(tp) != len(ref) else 0)
EOF2

# --- 6. batch_tp.sbatch on the device path: BATCH_DEVICE=cuda with the host twin's snapserve ----
# (SNAP_HOST_TWIN_BIN, set by ctest in CUDA builds: worker/device on the CPU, kernels/cuda/host),
# 3 ranks each holding its shard and KV heads "on its GPU", against one twin process outside
# Slurm (bf16 weights and KV: the CPU reference above differs by design). The corpus asks for
# the top-2 logprobs of every token: bf16 KV rounds the ranks' partial sums differently from
# one process's full sums, so a greedy choice may flip where one process's top two were nearly
# tied (seen: gaps of 0.001-0.03 on a Xeon whose OpenBLAS takes other GEMM paths for the shards'
# shapes). Every record must succeed or fail alike; tokens must be equal with logprobs within
# k_lp until the first flip, and a flip must pick one process's runner-up within 2 * k_lp of its
# top (the text after it is a different continuation, not compared).
device_note=""
if [ -n "${SNAP_HOST_TWIN_BIN:-}" ] && [ -x "${SNAP_HOST_TWIN_BIN}" ]; then
  twin=$(realpath "$SNAP_HOST_TWIN_BIN")
  python3 - "$work/corpus.jsonl" "$work/corpus_lp.jsonl" <<'EOF3' || fail "could not write the logprobs corpus"
import json, sys
out = []
for raw in open(sys.argv[1]):
    try:
        r = json.loads(raw)
    except ValueError:  # the malformed line stays malformed
        out.append(raw.rstrip("\n"))
        continue
    if r["url"].endswith("/chat/completions"):
        r["body"].update(logprobs=True, top_logprobs=2)
    else:
        r["body"]["logprobs"] = 2
    out.append(json.dumps(r))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
EOF3
  (cd "$work" && env -u SLURM_ARRAY_TASK_ID -u SLURM_ARRAY_TASK_MIN -u SLURM_ARRAY_TASK_COUNT \
     timeout 300 "$twin" batch --device cuda:0 --model "$model" --input corpus_lp.jsonl \
     --output device_reference.jsonl --threads 1 $batch_args >"$work/logs/device_reference.log" 2>&1) ||
    fail "the host twin's one-process batch failed: $(tail -3 "$work/logs/device_reference.log")"
  dev_rc=0
  (cd "$work" && SNAPSERVE_BIN=$twin SNAP_MODEL=$model BATCH_INPUT=corpus_lp.jsonl BATCH_OUTPUT=device_tp.jsonl \
     BATCH_THREADS=1 BATCH_DEVICE=cuda BATCH_ARGS="$batch_args --tp-comm host" \
     timeout 300 sbatch --wait --parsable --ntasks=3 --overcommit --output="$work/logs/device-tp-%j.out" \
     "$deploy/batch_tp.sbatch" >"$work/device_tp.jobid") || dev_rc=$?
  [ "$dev_rc" -eq 0 ] || fail "batch_tp.sbatch on the host twin ended with $dev_rc: $(tail -5 "$work"/logs/device-tp-*.out)"
  python3 - "$work" <<'EOF3' || fail "the device tensor-parallel records differ from one device process"
import json, sys
work = sys.argv[1]
k_lp = 0.15  # logprob bound on the shared prefix (measured worst: 0.077)
def load(p):
    return {json.loads(raw)["line"]: json.loads(raw) for raw in open(p)}
def steps(r):
    """[(token, {token: logprob} of the top 2)] of the first choice, chat or completions format."""
    ch = ((r.get("response") or {}).get("body") or {}).get("choices") or []
    if not ch:
        return None
    lp = ch[0].get("logprobs") or {}
    if "content" in lp:
        return [(c["token"], {t["token"]: t["logprob"] for t in c["top_logprobs"]}) for c in lp["content"]]
    return list(zip(lp["tokens"], lp["top_logprobs"]))
tp, ref = load(f"{work}/device_tp.jsonl"), load(f"{work}/device_reference.jsonl")
bad, flips, equal, worst = [], [], 0, 0.0
for k, r in sorted(ref.items()):
    t = tp.get(k)
    if t is None or t["custom_id"] != r["custom_id"] or (t["error"] is None) != (r["error"] is None):
        bad.append(f"{k}: missing or a different outcome")
        continue
    a, b = steps(r), steps(t)
    if a is None or b is None:
        if (a is None) != (b is None):
            bad.append(f"{k}: choices in one only")
        continue
    if len(a) != len(b) or not a:
        bad.append(f"{k}: {len(a)} vs {len(b)} tokens")
        continue
    for i, ((ta, alts_a), (tb, alts_b)) in enumerate(zip(a, b)):
        if ta != tb:
            top = sorted(alts_a.values(), reverse=True)
            gap = top[0] - top[1] if len(top) > 1 else float("inf")
            if tb in alts_a and gap <= 2 * k_lp:
                flips.append(f"{k}@{i} (gap {gap:.4f})")
            else:
                bad.append(f"{k}: token {i} {tb!r} instead of {ta!r}, one process's top-2 gap {gap:.4f}")
            break
        for tok, lp in alts_a.items():
            if tok in alts_b:
                d = abs(lp - alts_b[tok])
                worst = max(worst, d)
                if d > k_lp:
                    bad.append(f"{k}: token {i} logprob differs by {d:.3f}")
    else:
        equal += 1
print(f"batch_tp --device cuda (host twin): {len(tp)} records, {equal} equal to one device process, "
      f"near-tie flips {flips}, worst logprob difference {worst:.4f}, wrong {bad[:5]}")
sys.exit(1 if bad or len(tp) != len(ref) else 0)
EOF3
  device_note="; batch_tp --device cuda on the host twin (3 ranks) equal to one device process up to near-ties"
fi

echo "test_slurm_batch: PASS: array $array_job (3 shards; task 1 SIGKILLed at $killed1 lines," \
     "task 2 cancelled at $killed2 lines; both requeued and resumed), merge $merge_job; batch_tp" \
     "(3 ranks) equal to one process$device_note"
