#!/bin/bash
# One device check of the GPU path, under 8 minutes on one GPU; writes benchmarks/results_gpu.md.
#   benchmarks/device_check.sh                 on a CUDA machine (model.device=cuda)
#   benchmarks/device_check.sh --cpu-dry-run   the same steps on CPU with tiny budgets (report under $OUT)
# Steps: 1. every method greedy == autoregressive (outputs.jsonl token ids, mixed batch of 4)
#        2. specdec verify at T=1 on eagle3 and dflash (losslessness, chi-square + TV)
#        3. rejection kernel timing, torch vs flashinfer
#        4. engine.cuda_graphs on vs off (tokens/s, greedy eagle3)
set -u
cd "$(dirname "$0")/.."
SPECDEC=${SPECDEC:-.venv/bin/specdec}
PY=${PY:-.venv/bin/python}
if [ "${1:-}" = "--cpu-dry-run" ]; then
  DEV=cpu; TOKENS=4; SAMPLES=20; VOCAB=2000; ROUNDS=2; GRAPHS="off"
  OUT=${OUT:-/tmp/specdec_device_check_dry}; REPORT=$OUT/results_gpu.md
else
  DEV=cuda; TOKENS=32; SAMPLES=300; VOCAB=49152; ROUNDS=20; GRAPHS="off on"
  OUT=${OUT:-/tmp/specdec_device_check}; REPORT=benchmarks/results_gpu.md
fi
METHODS="draft_target mtp eagle3 pard dflash ngram suffix"
COMMON="model.device=$DEV workload=mixed workload.sampler_mix=[{temperature:0.0}] workload.max_new_tokens=$TOKENS engine.max_batch_size=4"
rm -rf "$OUT"; mkdir -p "$OUT"
status=0
{
  echo "# Device check ($DEV)"
  echo
  echo "$(date -u +%FT%TZ) · $($PY -c 'import torch; print("torch", torch.__version__, "·", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA")')"
  echo
  echo "## 1. Greedy speculative == autoregressive (token ids, mixed batch of 4, $TOKENS tokens)"
  echo
  echo "| method | identical | backend_usage | acceptance_length |"
  echo "|---|---|---|---|"
} > "$REPORT"
$SPECDEC run method=none $COMMON output_dir=$OUT/greedy_none > $OUT/greedy_none.log 2>&1 || { echo "method=none failed (see $OUT/greedy_none.log)" >> "$REPORT"; status=1; }
for m in $METHODS; do
  $SPECDEC run method=$m $COMMON output_dir=$OUT/greedy_$m > $OUT/greedy_$m.log 2>&1
  $PY - "$OUT" "$m" >> "$REPORT" <<'PYEOF' || status=1
import json, sys
out, method = sys.argv[1], sys.argv[2]
def ids(name):
    return [json.loads(line)["output_token_ids"] for line in open(f"{out}/greedy_{name}/outputs.jsonl")]
try:
    metrics = json.load(open(f"{out}/greedy_{method}/results.json"))["metrics"]
    same = ids(method) == ids("none")
    print(f"| {method} | {'yes' if same else 'NO'} | {metrics.get('backend_usage')} | {metrics['acceptance_length']:.2f} |")
    sys.exit(0 if same else 1)
except Exception as err:
    print(f"| {method} | FAILED ({type(err).__name__}: {err}) | | |")
    sys.exit(1)
PYEOF
done
{
  echo
  echo "## 2. Losslessness at T=1 (specdec verify, $SAMPLES samples per side)"
  echo
} >> "$REPORT"
for m in eagle3 dflash; do
  if $SPECDEC verify method=$m sampler=temperature model.device=$DEV --samples $SAMPLES --prompts 2 --tokens 2 > $OUT/verify_$m.log 2>&1; then
    echo "- $m: PASS" >> "$REPORT"
  else
    echo "- $m: FAIL (rc $?, see log below)" >> "$REPORT"; status=1
    echo '```' >> "$REPORT"; tail -n 15 $OUT/verify_$m.log >> "$REPORT"; echo '```' >> "$REPORT"
  fi
done
{
  echo
  echo "## 3. Rejection kernel"
  echo
} >> "$REPORT"
$PY benchmarks/bench_rejection_device.py --device $DEV --vocab $VOCAB --rounds $ROUNDS --out $OUT/kernel.md > /dev/null 2>&1 \
  && cat $OUT/kernel.md >> "$REPORT" || { echo "kernel timing failed" >> "$REPORT"; status=1; }
{
  echo
  echo "## 4. engine.cuda_graphs (eagle3, greedy, batch 4)"
  echo
  echo "| cuda_graphs | tokens/s | identical to off |"
  echo "|---|---|---|"
} >> "$REPORT"
for g in $GRAPHS; do
  $SPECDEC run method=eagle3 $COMMON engine.cuda_graphs=$g output_dir=$OUT/graphs_$g > $OUT/graphs_$g.log 2>&1
  $PY - "$OUT" "$g" >> "$REPORT" <<'PYEOF' || status=1
import json, sys
out, g = sys.argv[1], sys.argv[2]
def ids(name):
    return [json.loads(line)["output_token_ids"] for line in open(f"{out}/graphs_{name}/outputs.jsonl")]
try:
    rate = json.load(open(f"{out}/graphs_{g}/results.json"))["metrics"]["tokens_per_s"]
    print(f"| {g} | {rate:.1f} | {'yes' if ids(g) == ids('off') else 'NO'} |")
except Exception as err:
    print(f"| {g} | FAILED ({type(err).__name__}: {err}) | |")
    sys.exit(1)
PYEOF
done
echo >> "$REPORT"
echo "status: $([ $status = 0 ] && echo OK || echo FAILURES)" >> "$REPORT"
echo "wrote $REPORT"
exit $status
