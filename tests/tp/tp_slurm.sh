#!/usr/bin/env bash
# tp_slurm.sh SNAPSERVE [MODEL]: `snapserve generate --tp 3` launched by Slurm
# (`srun --mpi=pmix -n 3`, on a private one-node Slurm from tests/comm/slurm_local.sh)
# prints the same text as one process, and reports 3 MPI ranks and the all-reduce bytes.
# Exits 77 when Slurm is not installed.
set -uo pipefail
bin=$1
model=${2:-${SNAP_MODEL:-$HOME/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf}}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(generate --model "$model" --max-tokens 24 --threads 1 --ignore-eos --kv-policy snapkv --kv-budget 24
      --kv-window 8 --prompt "A lighthouse keeper found a bottle on the beach after the storm. Inside was a map of the coast, drawn by hand, with one cove circled twice in red ink. The next morning she")
if ! "$bin" "${args[@]}" > "$work/one.out" 2> "$work/one.err"; then
  echo "tp_slurm: one-process run failed:"; cat "$work/one.err"; exit 1
fi
bash "$here/../comm/slurm_local.sh" 3 "$bin" "${args[@]}" --tp 3 > "$work/tp.out" 2> "$work/tp.err"
rc=$?
if [ $rc -eq 77 ]; then cat "$work/tp.err"; exit 77; fi
if [ $rc -ne 0 ]; then
  echo "tp_slurm: srun job failed (rc $rc):"; cat "$work/tp.err"; exit 1
fi
if ! grep -q "tensor parallel 3 ranks (mpi)" "$work/tp.err"; then
  echo "tp_slurm: no tensor-parallel report:"; cat "$work/tp.err"; exit 1
fi
if ! cmp -s "$work/one.out" "$work/tp.out"; then
  echo "tp_slurm: text differs from one process"; diff "$work/one.out" "$work/tp.out"; exit 1
fi
echo "tp_slurm: srun --mpi=pmix -n 3 generate --tp 3 matches one process: $(head -c 80 "$work/tp.out")"
