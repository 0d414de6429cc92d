#!/usr/bin/env bash
# Re-runs the Azure-code 12-GPU plans of docs/planning.md (issue 22) from the repository root; each folder gets
# COMMAND.txt, output.txt (the terminal report, with the wall time) and plan.json.
set -euo pipefail
T=${PDCTL_TRACES:-../shared/traces}/azure_llm_2023/AzureLLMInferenceTrace_code.csv
D=experiments/results/plan/azure-code-12
COMMON=(--workload "$T" --slo ttft_p95=2s,tpot_p95=60ms --gpus 12 --model-profile h200-llama3-70b --tp 2
        --no-cache --quiet --workers 2 --top 8)
run() {
  local name=$1; shift
  mkdir -p "$D/$name"
  echo "pdctl plan ${COMMON[*]} $* --out $D/$name" | sed "s#$T#\${PDCTL_TRACES}/azure_llm_2023/AzureLLMInferenceTrace_code.csv#" > "$D/$name/COMMAND.txt"
  { /usr/bin/time -f "wall %e s, user %U s" pdctl plan "${COMMON[@]}" "$@" --out "$D/$name"; } > "$D/$name/output.txt" 2>&1
  rm -f "$D/$name/best_scenario.yaml"
}
run whole
run peak-window-3000 --max-whole-requests 3000
run horizon-30 --horizon 30
run horizon-600 --horizon 600
